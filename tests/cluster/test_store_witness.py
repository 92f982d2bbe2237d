"""The store witness (``torchstep.agent.witness``) from inside pods: the run's Lease through the
API as pods reach it (``tests/cluster/incluster.py``: TLS with the mounted CA, the token), two
halves racing for one split, a stranger without the token, and a half cut off from the
control plane by its node's partition."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from cluster.harness import Cluster

# A pod's claim: the witness as the agent makes it, its check, then one claim; one JSON line.
CLAIM = (
    "import json, sys, time\n"
    "from torchstep.agent.witness import LeaseWitness\n"
    "w = LeaseWitness.in_cluster('run-1')\n"
    "if w is None:\n"
    "    print(json.dumps({'witness': None})); sys.exit(0)\n"
    "problem = w.check()\n"
    "t = time.monotonic()\n"
    "won = w.claim(sys.argv[1], sys.argv[2], timeout_s=float(sys.argv[3]))\n"
    "print(json.dumps({'problem': problem, 'won': won, 's': round(time.monotonic() - t, 2)}))\n"
)


def claim_pod(cluster: Cluster, name: str, node: str, epoch: str, me: str, *, wait_for: str = "", **spec: Any) -> None:
    """Start a pod on ``node`` that claims ``epoch`` as ``me`` (once ``wait_for`` exists in the
    shared hostPath ``/go``, when given)."""
    (cluster.root / "go").mkdir(exist_ok=True)
    gate = f"while [ ! -e /go/{wait_for} ]; do sleep 0.05; done; " if wait_for else ""
    cluster.start_pod(
        name,
        ["sh", "-c", f'{gate}exec python -c "$0" "$@"', CLAIM, epoch, me, "6"],
        node,
        container={"volumeMounts": [{"name": "go", "mountPath": "/go"}]},
        volumes=[{"name": "go", "hostPath": {"path": str(cluster.root / "go")}}],
        **spec,
    )


def verdict(cluster: Cluster, name: str) -> dict[str, Any]:
    pod = cluster.pod_done(name)
    text = cluster.log(name)
    assert pod["status"]["phase"] == "Succeeded", text
    return dict(json.loads(text.strip().splitlines()[-1]))


def test_of_two_halves_claiming_one_split_exactly_one_wins_and_keeps_it(real_cluster: Cluster) -> None:
    claim_pod(real_cluster, "half-a", "node-0", "h0:29400#3", "node-a", wait_for="start")
    claim_pod(real_cluster, "half-b", "node-1", "h0:29400#3", "node-b", wait_for="start")
    real_cluster.wait(
        lambda: [p["status"].get("phase") for p in real_cluster.items("pods")] == ["Running", "Running"],
        message="both pods running",
    )
    (real_cluster.root / "go" / "start").touch()  # both claim at once
    a, b = verdict(real_cluster, "half-a"), verdict(real_cluster, "half-b")
    assert a["problem"] is None and b["problem"] is None
    assert sorted([a["won"], b["won"]]) == [False, True], (a, b)
    winner = "a" if a["won"] else "b"
    lease = real_cluster.api("GET", "/apis/coordination.k8s.io/v1/namespaces/ml/leases/torchstep-store-run-1")
    assert lease["spec"]["holderIdentity"] == f"node-{winner}"
    assert lease["metadata"]["annotations"]["torchstep.io/split"] == "h0:29400#3"
    # the split is decided: the winner asking again keeps it, the loser still loses
    claim_pod(real_cluster, "again-winner", f"node-{0 if winner == 'a' else 1}", "h0:29400#3", f"node-{winner}")
    claim_pod(real_cluster, "again-loser", "node-0", "h0:29400#3", "node-c")
    assert verdict(real_cluster, "again-winner")["won"] is True
    assert verdict(real_cluster, "again-loser")["won"] is False
    # a later split (another round) is a new claim: its first claimant wins
    claim_pod(real_cluster, "next-round", "node-1", "h0:29400#4", "node-c")
    assert verdict(real_cluster, "next-round")["won"] is True


def test_a_pod_without_the_token_gets_no_witness_and_a_wrong_token_is_refused(real_cluster: Cluster) -> None:
    claim_pod(real_cluster, "no-token", "node-0", "e#1", "x", automountServiceAccountToken=False)
    assert verdict(real_cluster, "no-token") == {"witness": None}
    stranger = (
        "import json, ssl, urllib.request, urllib.error\n"
        "ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
        "req = urllib.request.Request('https://10.244.0.1/apis/coordination.k8s.io/v1/namespaces/ml/leases/x',"
        " headers={'Authorization': 'Bearer guessed'})\n"
        "try:\n"
        "    urllib.request.urlopen(req, context=ctx, timeout=5); print(json.dumps({'code': 200}))\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(json.dumps({'code': e.code}))\n"
    )
    real_cluster.exec_pod(["python", "-c", stranger], name="stranger")
    assert verdict(real_cluster, "stranger") == {"code": 401}


def test_a_half_whose_node_is_partitioned_cannot_claim_and_the_other_half_can(real_cluster: Cluster) -> None:
    claim_pod(real_cluster, "cut", "node-0", "h0:29400#7", "node-a", wait_for="start")
    real_cluster.wait(lambda: real_cluster.get("pods", "cut")["status"].get("phase") == "Running")
    real_cluster.server.node("node-0", "partition")
    (real_cluster.root / "go" / "start").touch()
    t0 = time.monotonic()
    cut = verdict(real_cluster, "cut")
    assert cut["won"] is False and cut["s"] < 10, cut  # lost within the claim's bound, not a hang
    assert time.monotonic() - t0 < 60
    claim_pod(real_cluster, "other", "node-1", "h0:29400#7", "node-b")
    assert verdict(real_cluster, "other")["won"] is True


def test_the_in_cluster_files_are_where_pods_look(real_cluster: Cluster, tmp_path: Path) -> None:
    pod = real_cluster.exec_pod(
        [
            "sh",
            "-c",
            "cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo; "
            'echo "$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT"; '
            "head -c 27 /var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
        ],
        name="files",
    )
    assert pod["status"]["phase"] == "Succeeded"
    lines = real_cluster.log("files").splitlines()
    assert lines == ["ml", "10.244.0.1:443", "-----BEGIN CERTIFICATE-----"]
