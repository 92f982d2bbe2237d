"""Losing the store's replica on the one-machine cluster's pods (issue 36, goal 2): a rendered
2-replica elastic Indexed Job (``--nnodes 1:2``) of a gloo all-reduce loop
(``bench/scripts/silent_train.py``), one replica per node; once both train together, replica
0's pod — where the c10d store lives — is deleted (SIGTERM to its container's first process,
then its network is gone). Measured: the deletion -> replica 1's first all-reduce in a group
formed after it (the first step after a pause of over a second), and whether replica 1 still
runs in the same pod. Three launchers on the same Job:

* ``torchstep-agent`` with the kubernetes run option ``store_takeover`` (the store moves to
  replica 1, which trains on in its pod; index 0's replacement joins it);
* ``torchstep-agent`` with ``store_takeover=False`` (torchrun's way, the default before the
  option was: the survivor loses the store, exits 83 and is replaced, as torchrun's pods are);
* ``torchrun`` (the same Job, the container's command ``python -m torch.distributed.run``).

With ``--fault partition`` (figure 12j) the Job has three replicas (``--nnodes 1:3``), one per
node, and replica 0's node is partitioned instead (its link cut, its processes alive, nothing
sent). Measured: the cut -> the first all-reduce of replicas 1 *and* 2 at world size 2, whether
replica 0 stopped its worker (and when) and whether it trained on alone (a second run). With
``store_takeover`` replicas 1 and 2 are a majority of the last round: they move the store and
train on, and replica 0, outvoted, stops; with the option off replica 0 trains on alone and the two
others stop their workers; torchrun's survivors hang.

What did not happen within ``--window`` seconds counts as the window (a lower bound, said in
the figure's note). Needs root. Usage: ``python bench/store_loss_pods.py [--fault
delete|partition] [--runs N] [--window S] [--json]``; figures 12i and 12j in
bench/results.json (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))  # the one-machine cluster is test infrastructure
sys.path.insert(0, str(BENCH))

from cluster.controller import new_prefix  # noqa: E402
from cluster.harness import Cluster, cluster_config, missing  # noqa: E402
from cluster.kubelet import cleanup  # noqa: E402
from kubehttp import start_server  # noqa: E402
from silent_host import fmt_seconds, steps, wait_for  # noqa: E402
from silent_pods import _pods, create_two, finish, remove, train_role  # noqa: E402

LAUNCHERS = ("torchrun", "torchstep-agent", "torchstep-agent+store_takeover")
FIGURES = {
    "delete": ("12i", "pods: the store's replica 0 deleted, --nnodes 1:2: deletion -> replica 1 trains again"),
    "partition": (
        "12j",
        "pods: the store's node (replica 0 of 3) partitioned, --nnodes 1:3: cut -> replicas 1 and 2 train at world 2",
    ),
}
REPLICAS = {"delete": 2, "partition": 3}


def objects(launcher: str, work: Path, replicas: int = 2) -> tuple[str, list[dict[str, Any]]]:
    """The rendered Job (with its Service and NetworkPolicy) and its app id."""
    import torchstep
    from torchx import specs

    # index 0's replacement (and, without the move, index 1's): REPLICA retries
    role = train_role(work, replicas, min_replicas=1, max_retries=2, retry_policy=specs.RetryPolicy.REPLICA)
    cfg: dict[str, Any] = {"run_id": f"r{uuid.uuid4().hex[:8]}"}
    cfg["store_takeover"] = launcher.endswith("+store_takeover")  # "torchstep-agent": the option off
    objs = torchstep.kubernetes.render(specs.AppDef("loss", roles=[role]), namespace="ml", cfg=cfg)
    job = next(o for o in objs if o["kind"] == "Job")
    if launcher == "torchrun":
        container = job["spec"]["template"]["spec"]["containers"][0]
        container["command"] = [sys.executable, "-m", "torch.distributed.run"]
        container.pop("readinessProbe", None)
    return job["metadata"]["labels"]["torchstep/app-id"], objs


def scenario(cluster: Cluster, launcher: str, *, window: float, work: Path) -> dict[str, Any]:
    """One run; ``again_s`` (None: not within ``window``) and ``same_pod`` (replica 1's pod uid
    unchanged when it trained again)."""
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    app_id, objs = objects(launcher, work)
    out: dict[str, Any] = {"tool": launcher}
    try:
        pods = create_two(cluster, app_id, objs)
        if not pods or pods[0]["spec"]["nodeName"] == pods[1]["spec"]["nodeName"]:
            raise RuntimeError(f"{launcher}: the two pods were not scheduled on two nodes")
        if not wait_for(lambda: all(sum(1 for _, w in steps(work, r) if w == 2) >= 5 for r in (0, 1)), 240, 0.5):
            raise RuntimeError(f"{launcher}: the two replicas did not train together within 240 s")
        uid1 = pods[1]["metadata"]["uid"]
        out["load_1m"] = round(os.getloadavg()[0], 2)
        t_del = time.time()
        cluster.delete("pods", pods[0]["metadata"]["name"])

        def again() -> float | None:
            last = t_del
            for t, _ in steps(work, 1):
                if t > t_del and t - last > 1.0:
                    return t
                last = max(last, t)
            return None

        t_again = wait_for(again, window, 0.2)
        out["again_s"] = None if not t_again else round(t_again - t_del, 2)
        now = _pods(cluster, app_id).get(1)
        out["same_pod"] = bool(now) and now["metadata"]["uid"] == uid1
    finally:
        remove(cluster, app_id, objs)
    return out


def partition(cluster: Cluster, launcher: str, *, window: float, work: Path) -> dict[str, Any]:
    """One run of ``--fault partition``: ``again_s`` (replicas 1 and 2 both at world size 2;
    None: not within ``window``), ``stopped_s`` (replica 0's worker gone), ``alone_s``
    (replica 0 trained at world size 1 after the cut: a second run beside the others')."""
    from silent_pods import workers

    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    app_id, objs = objects(launcher, work, replicas=3)
    out: dict[str, Any] = {"tool": launcher}
    node: str | None = None
    try:
        pods = create_two(cluster, app_id, objs, count=3)
        if not pods or len({p["spec"]["nodeName"] for p in pods.values()}) != 3:
            raise RuntimeError(f"{launcher}: the three pods were not scheduled on three nodes")
        if not wait_for(lambda: all(sum(1 for _, w in steps(work, r) if w == 3) >= 5 for r in range(3)), 240, 0.5):
            raise RuntimeError(f"{launcher}: the three replicas did not train together within 240 s")
        node = pods[0]["spec"]["nodeName"]
        out["load_1m"] = round(os.getloadavg()[0], 2)
        t_cut = time.time()
        cluster.server.node(node, "partition")

        def first(replica: int, world: int) -> float | None:
            return next((t for t, w in steps(work, replica) if t > t_cut and w == world), None)

        stopped: float | None = None
        while time.time() - t_cut < window:
            if stopped is None and not workers(cluster, app_id, 0):
                stopped = time.time()
            if stopped is not None and all(first(r, 2) for r in (1, 2)):
                break
            time.sleep(0.1)
        both = [first(r, 2) for r in (1, 2)]
        out["again_s"] = round(max(t for t in both if t) - t_cut, 2) if all(both) else None
        out["stopped_s"] = None if stopped is None else round(stopped - t_cut, 2)
        alone = first(0, 1)
        out["alone_s"] = None if alone is None else round(alone - t_cut, 2)
    finally:
        finish(cluster, app_id, objs, work, node)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", choices=sorted(FIGURES), default="delete")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="a subset (then no figure is recorded)")
    parser.add_argument("--json", action="store_true", help="print the rows only; record no figure")
    args = parser.parse_args()
    launchers = [x for x in LAUNCHERS if x in args.launchers.split(",")]
    run_one = partition if args.fault == "partition" else scenario
    reason = missing()
    if reason:
        sys.exit(f"bench/store_loss_pods.py needs the one-machine cluster: {reason}")
    work = Path(tempfile.mkdtemp(prefix="store_loss_pods."))
    prefix = new_prefix()
    server = start_server(work / "api", real=cluster_config(work / "cluster", prefix, nodes=REPLICAS[args.fault]))
    cluster = Cluster(server, work / "cluster", prefix=prefix)
    rows: list[dict[str, Any]] = []
    try:
        for run in range(args.runs):
            for launcher in launchers if run % 2 == 0 else reversed(launchers):
                try:
                    row = run_one(cluster, launcher, window=args.window, work=work / f"{launcher}-{run}")
                except RuntimeError as e:
                    row = {"tool": launcher, "error": str(e)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        server.stop()
        cleanup(prefix, work / "cluster")
    vals = {t: [r.get("again_s") for r in rows if r["tool"] == t and "error" not in r] for t in LAUNCHERS}
    for t in LAUNCHERS:
        print(f"{t}: {fmt_seconds(vals[t], args.window) if vals[t] else '-'}")
    if args.json or not all(vals.values()):
        return
    sys.path.insert(0, str(BENCH / "scripts"))
    from figures import record

    def counted(v: list[float | None]) -> list[float]:
        return [args.window if x is None else x for x in v]

    before = counted(vals["torchstep-agent"])
    loads = [r["load_1m"] for r in rows if r.get("load_1m") is not None]
    if args.fault == "partition":
        ours = [r for r in rows if r["tool"] == LAUNCHERS[2] and "error" not in r]
        default = [r for r in rows if r["tool"] == "torchstep-agent" and "error" not in r]
        notes = [
            "torchstep-agent with store_takeover: replica 0 (outvoted) stopped its worker after "
            + ", ".join("-" if r["stopped_s"] is None else f"{r['stopped_s']:g} s" for r in ours)
            + f" and trained on alone in {sum(1 for r in ours if r['alone_s'] is not None)} of {len(ours)} runs",
            "before (store_takeover off): replicas 1 and 2 did not train again "
            f"({sum(1 for r in default if r['again_s'] is None)} of {len(default)} runs); replica 0 trained on "
            f"alone in {sum(1 for r in default if r['alone_s'] is not None)} of {len(default)}",
            f"1-minute load average at the cuts {min(loads):g}-{max(loads):g} on {os.cpu_count()} cores",
        ]
    else:
        same = [r.get("same_pod") for r in rows if r["tool"] == LAUNCHERS[2] and "error" not in r]
        notes = [
            f"torchstep-agent with store_takeover: replica 1 in the same pod in {sum(1 for s in same if s)} of "
            f"{len(same)} runs",
            f"before (store_takeover off): {statistics.median(before):.2f} s (median), replica 1 replaced",
            f"1-minute load average at the deletions {min(loads):g}-{max(loads):g} on {os.cpu_count()} cores",
        ]
    for t in LAUNCHERS:
        n = sum(1 for x in vals[t] if x is None)
        if n:
            notes.append(
                f"{t}: {n} of {len(vals[t])} runs had not trained again after {args.window:g} s (counted as {args.window:g} s)"
            )
    figure = FIGURES[args.fault]
    record(
        figure[0],
        figure[1],
        counted(vals[LAUNCHERS[2]]),
        counted(vals["torchrun"]),
        peer_name="torchrun",
        goal=10.0,
        goal_on="ours",
        command=f"python bench/store_loss_pods.py --fault {args.fault} --runs {args.runs} --window {args.window:g}",
        note="; ".join(notes),
    )


if __name__ == "__main__":
    main()
