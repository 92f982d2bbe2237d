"""The Job controller, the garbage collector and the nodes of the one-machine cluster, with
real pods (small shell containers, no torch): the Kubernetes semantics the rendered Jobs
rely on — per-index retries, podFailurePolicy on exit codes and on DisruptionTarget,
suspend, deadlines, TTL, foreground deletion — and what a node drain, loss or partition does."""

from __future__ import annotations

import time
from typing import Any

from cluster.harness import Cluster

INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
FAILURES = "metadata.annotations['batch.kubernetes.io/job-index-failure-count']"


def job(name: str, script: str, completions: int = 1, **spec: Any) -> dict[str, Any]:
    """An Indexed Job whose pods run ``script`` with ``$IDX`` (the completion index), ``$FAILS``
    (the index's failure count) and a PVC ``/state`` shared by every pod."""
    container = {
        "name": "main",
        "image": "x",
        "command": ["sh", "-c", script],
        "env": [{"name": "IDX", "valueFrom": {"fieldRef": {"fieldPath": INDEX}}}],
        "volumeMounts": [{"name": "state", "mountPath": "/state"}],
    }
    if "backoffLimitPerIndex" in spec:
        container["env"].append({"name": "FAILS", "valueFrom": {"fieldRef": {"fieldPath": FAILURES}}})
    template = {
        "metadata": {"labels": {"test": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": spec.pop("grace", 5),
            "containers": [container],
            "volumes": [{"name": "state", "persistentVolumeClaim": {"claimName": name}}],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"test": name}},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "template": template,
            **spec,
        },
    }


def condition(job_obj: dict[str, Any]) -> tuple[str, str]:
    c = next(c for c in job_obj["status"]["conditions"] if c["type"] in ("Complete", "Failed"))
    return c["type"], c.get("reason", "")


def pods_of(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return cluster.items("pods", f"job-name={name}")


def pod_log_tail(cluster: Cluster, pod: str) -> str:
    try:
        return cluster.log(pod)[-300:]
    except OSError as e:  # a pod gone since the listing
        return f"(no log: {e})"


def pod_summary(cluster: Cluster, name: str) -> list[tuple[str, str, str, object, str]]:
    """Each pod of the Job as (index, failure count, phase, exit code, its log's tail): what an
    assertion about the Job's counts shows when it fails."""
    out = []
    for pod in pods_of(cluster, name):
        notes = pod["metadata"].get("annotations") or {}
        term = next(
            (
                s["state"]["terminated"]
                for s in pod["status"].get("containerStatuses") or []
                if "terminated" in s["state"]
            ),
            {},
        )
        out.append(
            (
                notes.get("batch.kubernetes.io/job-completion-index", "?"),
                notes.get("batch.kubernetes.io/job-index-failure-count", "?"),
                pod["status"].get("phase", "?"),
                term.get("exitCode"),
                pod_log_tail(cluster, pod["metadata"]["name"]),
            )
        )
    return sorted(out)


def test_per_index_retries_and_the_failure_policy_on_exit_codes(real_cluster: Cluster) -> None:
    script = (
        "case $IDX in 0) exit 0;;"
        ' 1) [ "$FAILS" = 0 ] && exit 3; exit 0;;'  # fails once, counted, then succeeds
        " 2) exit 9;;"  # FailIndex at once
        " 3) [ -e /state/3 ] && exit 0; touch /state/3; exit 7;; esac"
    )  # an ignored failure
    rules = [
        {"action": "Ignore", "onExitCodes": {"containerName": "main", "operator": "In", "values": [7]}},
        {"action": "FailIndex", "onExitCodes": {"containerName": "main", "operator": "In", "values": [9]}},
    ]
    real_cluster.create(job("per-index", script, 4, backoffLimitPerIndex=1, podFailurePolicy={"rules": rules}))
    done = real_cluster.job_done("per-index")
    seen = pod_summary(real_cluster, "per-index")
    assert condition(done) == ("Failed", "FailedIndexes"), seen
    assert done["status"]["failedIndexes"] == "2" and done["status"]["completedIndexes"] == "0-1,3", seen
    assert done["status"]["failed"] == 2, seen  # index 1's first pod and index 2's; the ignored exit 7 is not counted
    by_index: dict[str, list[dict[str, Any]]] = {}
    for pod in pods_of(real_cluster, "per-index"):
        by_index.setdefault(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"], []).append(pod)
    assert {i: len(p) for i, p in by_index.items()} == {"0": 1, "1": 2, "2": 1, "3": 2}
    counts = sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] for p in by_index["1"])
    assert counts == ["0", "1"]  # the replacement carries the index's failure count
    assert all(
        p["metadata"]["annotations"]["batch.kubernetes.io/job-index-failure-count"] == "0" for p in by_index["3"]
    )
    assert all(p["spec"]["hostname"] == f"per-index-{i}" for i, ps in by_index.items() for p in ps)


def test_failjob_stops_the_whole_job_and_backoff_limit_counts_failures(real_cluster: Cluster) -> None:
    rules = [{"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [82]}}]
    real_cluster.create(
        job(
            "fail-job",
            "[ $IDX = 1 ] && exit 82; trap 'exit 143' TERM; sleep 60 & wait",
            2,
            backoffLimit=3,
            podFailurePolicy={"rules": rules},
        )
    )
    real_cluster.create(job("backoff", "exit 4", 1, backoffLimit=1))
    t0 = time.monotonic()
    failed = real_cluster.job_done("fail-job")
    assert condition(failed) == ("Failed", "PodFailurePolicy")
    # the running index is terminated with the Job, not left to run its 60 s
    real_cluster.wait(
        lambda: (
            all(p["status"]["phase"] == "Failed" for p in pods_of(real_cluster, "fail-job"))
            or not pods_of(real_cluster, "fail-job")
        ),
        30,
        "fail-job's pods to end",
    )
    assert time.monotonic() - t0 < 45
    backoff = real_cluster.job_done("backoff")
    assert condition(backoff) == ("Failed", "BackoffLimitExceeded") and backoff["status"]["failed"] == 2
    assert len(pods_of(real_cluster, "backoff")) == 2  # the first pod and one retry (backoffLimit 1)


def test_drain_evicts_with_disruption_target_which_the_policy_can_ignore(real_cluster: Cluster) -> None:
    rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    script = "[ -e /state/ran ] && exit 0; touch /state/ran; trap 'exit 143' TERM; sleep 60 & wait"
    real_cluster.create(job("drained", script, 1, backoffLimit=0, podFailurePolicy={"rules": rules}))
    first = real_cluster.wait(
        lambda: [p for p in pods_of(real_cluster, "drained") if p["status"]["phase"] == "Running"],
        60,
        "the first pod to run",
    )[0]
    node = first["spec"]["nodeName"]
    evicted = real_cluster.server.node(node, "drain")["pods"]
    assert evicted == [first["metadata"]["name"]]
    done = real_cluster.job_done("drained")
    assert condition(done) == ("Complete", "CompletionsReached") and done["status"]["failed"] == 0
    pods = pods_of(real_cluster, "drained")
    replacement = [p for p in pods if p["metadata"]["name"] != first["metadata"]["name"]]
    assert len(replacement) == 1 and replacement[0]["spec"]["nodeName"] != node  # the drained node is cordoned
    gone = real_cluster.get("pods", first["metadata"]["name"])
    assert gone.get("code") == 404  # the evicted pod terminated (SIGTERM, exit 143) and went
    events = [
        e["reason"] for e in real_cluster.items("events") if e["involvedObject"]["name"] == first["metadata"]["name"]
    ]
    assert "Evicted" in events and "Killing" in events


def test_suspend_resume_and_the_active_deadline(real_cluster: Cluster) -> None:
    real_cluster.create(job("later", "echo ran", 1, suspend=True))
    real_cluster.create(
        job(
            "deadline",
            "trap 'echo got TERM; exit 143' TERM; sleep 60 & wait",
            1,
            activeDeadlineSeconds=3,
            backoffLimit=2,
        )
    )
    time.sleep(2)
    later = real_cluster.get("jobs", "later")
    assert not pods_of(real_cluster, "later") and later["status"]["active"] == 0
    assert any(c["type"] == "Suspended" and c["status"] == "True" for c in later["status"]["conditions"])
    real_cluster.api("PATCH", real_cluster.path("jobs", "later"), {"spec": {"suspend": False}})
    assert condition(real_cluster.job_done("later")) == ("Complete", "CompletionsReached")
    done = real_cluster.job_done("deadline")
    assert condition(done) == ("Failed", "DeadlineExceeded")
    real_cluster.wait(
        lambda: not [p for p in pods_of(real_cluster, "deadline") if p["status"]["phase"] == "Running"],
        30,
        "the pod to be stopped",
    )
    events = real_cluster.items("events")
    created = [e for e in events if e["involvedObject"]["name"] == "deadline" and e["reason"] == "SuccessfulCreate"]
    assert len(created) == 1  # no retry after the deadline, whatever backoffLimit says
    stopped = real_cluster.wait(
        lambda: [
            e["message"]
            for e in real_cluster.items("events")
            if e["involvedObject"]["name"].startswith("deadline-0-") and e["reason"] == "Failed"
        ],
        30,
        "the pod's end",
    )
    assert "exited 143" in stopped[0]  # SIGTERMed within its grace period, as kubelet does


def test_ttl_and_foreground_deletion_collect_every_owned_object(real_cluster: Cluster) -> None:
    real_cluster.create(job("short-lived", "echo done", 1, ttlSecondsAfterFinished=1))
    real_cluster.create(job("running", "trap 'exit 143' TERM; sleep 60 & wait", 2, grace=5))
    owner = real_cluster.wait(lambda: real_cluster.get("jobs", "running").get("metadata", {}).get("uid"))
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": "running",
                "ownerReferences": [
                    {"apiVersion": "batch/v1", "kind": "Job", "name": "running", "uid": owner, "controller": False}
                ],
            },
            "spec": {"clusterIP": "None", "selector": {"test": "running"}},
        }
    )
    real_cluster.wait(
        lambda: real_cluster.get("jobs", "short-lived").get("code") == 404, 60, "the TTL to delete the Job"
    )
    assert not pods_of(real_cluster, "short-lived")
    real_cluster.wait(
        lambda: len([p for p in pods_of(real_cluster, "running") if p["status"]["phase"] == "Running"]) == 2,
        60,
        "both pods to run",
    )
    real_cluster.delete("jobs", "running", propagationPolicy="Foreground")
    marked = real_cluster.get("jobs", "running")
    assert "deletionTimestamp" in marked["metadata"]  # it stays until what it owns is gone
    real_cluster.wait(lambda: real_cluster.get("jobs", "running").get("code") == 404, 60, "the Job to go")
    assert not pods_of(real_cluster, "running") and real_cluster.get("services", "running").get("code") == 404


def test_a_lost_node_fails_its_pods_with_disruption_target_and_a_partition_cuts_only_links(
    real_cluster: Cluster,
) -> None:
    server = (
        "import socket\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind(('0.0.0.0', 7000)); s.listen()\n"
        "while True:\n    c, _ = s.accept(); c.sendall(b'hi'); c.close()\n"
    )
    client = (
        "import socket, sys, time\n"
        "while True:\n"
        "    try:\n        socket.create_connection((sys.argv[1], 7000), timeout=1).recv(2); print('ok', flush=True)\n"
        "    except OSError as e:\n        print('cut', flush=True)\n"
        "    time.sleep(0.3)\n"
    )

    def place(name: str, code: str, node: str, args: list[str]) -> None:
        real_cluster.start_pod(name, ["python3", "-c", code], node, container={"args": args})

    place("srv", server, "node-0", [])
    ip = real_cluster.wait(lambda: real_cluster.get("pods", "srv")["status"].get("podIP"), 60, "srv's IP")
    place("cli", client, "node-1", [ip])
    real_cluster.wait(lambda: "ok" in real_cluster.log("cli"), 60, "the client to connect")
    real_cluster.server.node("node-0", "partition")
    mark = len(real_cluster.log("cli").splitlines())
    real_cluster.wait(lambda: "cut" in real_cluster.log("cli").splitlines()[mark:], 30, "the partition to cut")
    assert real_cluster.get("pods", "srv")["status"]["phase"] == "Running"  # its process lives on
    real_cluster.server.node("node-0", "heal")
    mark = len(real_cluster.log("cli").splitlines())
    real_cluster.wait(lambda: "ok" in real_cluster.log("cli").splitlines()[mark:], 30, "the link to heal")
    real_cluster.server.node("node-0", "lose")
    lost = real_cluster.wait(
        lambda: (p := real_cluster.get("pods", "srv"))["status"]["phase"] == "Failed" and p,
        30,
        "the lost node's pod to fail",
    )
    assert any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in lost["status"]["conditions"])
    assert real_cluster.get("pods", "cli")["status"]["phase"] == "Running"
    real_cluster.delete("pods", "cli", gracePeriodSeconds=0)


def test_network_policies_are_stored_listed_and_collected_with_their_owner(real_cluster: Cluster) -> None:
    real_cluster.create(job("owner", "echo done", 1))
    uid = real_cluster.wait(lambda: real_cluster.get("jobs", "owner").get("metadata", {}).get("uid"))
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": "owner",
            "labels": {"test": "owner"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "owner", "uid": uid}],
        },
        "spec": {"podSelector": {"matchLabels": {"test": "owner"}}, "policyTypes": ["Ingress"]},
    }
    made = real_cluster.create(policy)
    assert made["kind"] == "NetworkPolicy" and made["apiVersion"] == "networking.k8s.io/v1"
    assert real_cluster.create(policy)["code"] == 409
    assert [p["metadata"]["name"] for p in real_cluster.items("networkpolicies", "test=owner")] == ["owner"]
    real_cluster.job_done("owner")  # stored, not enforced: the pod ran whatever the policy says
    real_cluster.delete("jobs", "owner")
    real_cluster.wait(lambda: not real_cluster.items("networkpolicies"), 30, "the policy to go with its Job")
