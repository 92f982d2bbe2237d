"""Silent host on the one-machine cluster's pods (tests/cluster): a rendered 2-replica Indexed
Job (``--nnodes 1:2`` elastic, or a fixed ``--nnodes 2``) of a gloo all-reduce loop
(``bench/scripts/silent_train.py``), each replica on its own node; then one node is
partitioned (its link cut, its processes alive: nothing is sent, as with a power loss or a
switch port going down): replica 1's, then replica 0's (where the c10d store lives).
Measured for the rendered Job as it is (torchstep-agent) and for the same Job with torchrun as
the pods' launcher (the container's command becomes ``python -m torch.distributed.run`` with
the same arguments; the agent's readiness probe, which torchrun cannot satisfy, is dropped):

* elastic: the cut -> the first all-reduce at world size 1 on a survivor, and when the other
  side's worker is gone (the side that cannot reach the store stops, or not);
* fixed: the cut -> the surviving replica's container exits, with its termination message
  (torchstep-agent: the result's state, retryable and root cause).

Each probe ends after ``--window`` seconds; what did not happen by then counts as the window
(a lower bound, said so in the figure's note). Needs root (the cluster's namespaces and
cgroups). Usage: ``python bench/silent_pods.py [--runs N] [--window S] [--json]``; figures
12e-12h in bench/results.json (docs/performance.md via bench/report.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TRAIN = str(BENCH / "scripts" / "silent_train.py")
sys.path.insert(0, str(ROOT / "tests"))  # the one-machine cluster is test infrastructure

from cluster.controller import new_prefix  # noqa: E402
from cluster.harness import Cluster, cluster_config, missing  # noqa: E402
from cluster.kubelet import cleanup  # noqa: E402
from kubehttp import start_server  # noqa: E402
from silent_host import fmt_seconds, steps, wait_for  # noqa: E402  (beside this script)

TOOLS = ("torchrun", "torchstep-agent")
INDEX = "batch.kubernetes.io/job-completion-index"
#: (elastic, cut replica) -> figure and what it measures
FIGURES = {
    (True, 1): ("12e", "pods: replica 1's node partitioned, --nnodes 1:2: cut -> replica 0's next all-reduce"),
    (True, 0): (
        "12f",
        "pods: the store's node (replica 0) partitioned, --nnodes 1:2: cut -> first all-reduce at world 1",
    ),
    (False, 1): ("12g", "pods: replica 1's node partitioned, --nnodes 2: cut -> replica 0's container exits"),
    (False, 0): ("12h", "pods: the store's node (replica 0) partitioned, --nnodes 2: cut -> replica 1 exits"),
}


def train_role(work: Path, replicas: int = 2, **kw: Any) -> Any:
    """The benchmark's role of ``replicas`` replicas: the gloo all-reduce loop, one step file
    per replica in ``work`` (a host directory, readable while the replica's node is cut);
    ``kw``: more ``specs.Role`` fields (``min_replicas``, retries)."""
    from torchx import specs

    fields: dict[str, Any] = {"max_retries": 0, **kw}
    return specs.Role(
        "t",
        image="onemachine",
        entrypoint="python",
        args=[TRAIN],
        env={"SILENT_LOG": f"/silent/steps.{specs.macros.replica_id}", "OMP_NUM_THREADS": "1"},
        num_replicas=replicas,
        mounts=[specs.BindMount(src_path=str(work), dst_path="/silent")],
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
        **fields,
    )


def objects(tool: str, elastic: bool, work: Path) -> tuple[str, list[dict[str, Any]]]:
    """The rendered objects of the benchmark's Job (Service, NetworkPolicy, Job) and its app id;
    for ``torchrun`` the container runs ``python -m torch.distributed.run`` with the agent's
    arguments instead of ``torchstep-agent``."""
    import torchstep
    from torchx import specs

    role = train_role(work, min_replicas=1 if elastic else None)
    objs = torchstep.kubernetes.render(
        specs.AppDef("silent", roles=[role]), namespace="ml", cfg={"run_id": f"r{uuid.uuid4().hex[:8]}"}
    )
    job = next(o for o in objs if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    app_id = job["metadata"]["labels"]["torchstep/app-id"]
    if not elastic:
        # a partitioned node's kubelet still reports to this cluster's API server (a real one's
        # cannot), so the cut replica's own failure would fail the Job (backoffLimit 0) and
        # SIGTERM the survivor before it decides by itself: one counted failure is allowed
        # (the same for both launchers), what the survivor does is what is measured
        job["spec"]["backoffLimit"] = 1
    if tool == "torchstep-agent":  # its result on the host too: a failed pod may be replaced (and gone) at once
        container["env"].append(
            {"name": "TORCHSTEP_RESULT_FILE", "value": "/silent/result.$(TORCHSTEP_REPLICA_ID).json"}
        )
    if tool == "torchrun":
        assert container["command"] == ["torchstep-agent"], container["command"]
        from torch.distributed.run import get_args_parser

        get_args_parser().parse_args(container["args"])  # every argument is torchrun's own (else SystemExit)
        container["command"] = [sys.executable, "-m", "torch.distributed.run"]
        container.pop("readinessProbe", None)
    return app_id, objs


def workers(cluster: Cluster, app_id: str, replica: int) -> list[int]:
    """The host pids of replica ``replica``'s training workers (not its launcher)."""
    found = []
    for pid in cluster.pod_processes():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"silent_train.py" not in cmd or b"torchstep-agent" in cmd or b"torch.distributed.run" in cmd:
            continue
        if f"TORCHSTEP_APP_ID={app_id}".encode() in env and f"TORCHSTEP_REPLICA_ID={replica}".encode() in env:
            found.append(pid)
    return found


def _pods(cluster: Cluster, app_id: str) -> dict[int, dict[str, Any]]:
    pods = cluster.items("pods", f"torchstep/app-id={app_id}")
    return {int(p["metadata"]["annotations"][INDEX]): p for p in pods if "deletionTimestamp" not in p["metadata"]}


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    if pod.get("code") == 404:  # ended, counted and replaced by the Job controller between two reads
        return {"gone": True}
    if pod.get("kind") != "Pod":
        raise RuntimeError(f"reading the surviving pod failed: {pod}")
    for status in pod["status"].get("containerStatuses") or []:
        if "terminated" in status.get("state", {}):
            return dict(status["state"]["terminated"])
    return None


def scenario(
    cluster: Cluster, tool: str, *, cut: int, elastic: bool, window: float, work: Path, form_s: float = 240.0
) -> dict[str, Any]:
    """One run: both replicas train at world 2 on their own nodes, replica ``cut``'s node is
    partitioned; what the other side (and the cut side) does within ``window`` seconds.

    Args:
        cluster: a running one-machine cluster with nodes ``node-0`` and ``node-1``.
        tool: ``torchstep-agent`` (the rendered Job) or ``torchrun`` (its command replaced).
        cut: the replica whose node is partitioned (0 hosts the c10d store).
        elastic: ``--nnodes 1:2`` when true, else a fixed ``--nnodes 2``.
        window: seconds after the cut that each probe waits.
        work: a fresh directory (the replicas' step files; mounted into the pods).
        form_s: how long the two replicas may take to start and train together.

    Returns:
        ``again_s``/``again_replica`` (elastic: the first all-reduce at world 1 after the cut),
        ``stopped_replica``/``stopped_s`` (elastic: the other side's worker gone),
        ``fail_s`` (fixed: the surviving replica's container exited), ``exit_code`` and
        ``message`` (its termination message), each ``None`` when it did not happen within
        ``window``; ``load_1m``, the 1-minute load average at the cut.

    Raises:
        RuntimeError: the replicas did not land on two nodes or did not train together.
    """
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    app_id, objs = objects(tool, elastic, work)
    out: dict[str, Any] = {"tool": tool, "cut": cut, "elastic": elastic}
    node: str | None = None
    try:
        pods = create_two(cluster, app_id, objs)
        if not pods:
            raise RuntimeError(f"{tool}: the Job's two pods were not scheduled within 60 s")
        nodes = {i: p["spec"]["nodeName"] for i, p in pods.items()}
        if len(set(nodes.values())) != 2:
            raise RuntimeError(f"{tool}: both replicas landed on one node ({nodes})")
        formed = wait_for(lambda: all(sum(1 for _, w in steps(work, r) if w == 2) >= 5 for r in (0, 1)), form_s, 0.5)
        if not formed:
            raise RuntimeError(f"{tool}: the two replicas did not train together within {form_s:g} s (see {work})")
        other = 1 - cut
        node = nodes[cut]
        out["load_1m"] = round(os.getloadavg()[0], 2)
        t_cut = time.time()
        cluster.server.node(node, "partition")
        if elastic:

            def again_on() -> tuple[int, float] | None:
                for replica in (other, cut):  # the store's replica may train on alone when it is cut
                    t = next((t for t, w in steps(work, replica) if t > t_cut and w == 1), None)
                    if t is not None:
                        return replica, t
                return None

            # one loop for both: when the survivor trains again, and when each side's worker is gone
            again: tuple[int, float] | None = None
            gone: dict[int, float] = {}
            while time.time() - t_cut < window:
                again = again or again_on()
                for replica in (0, 1):
                    if replica not in gone and not workers(cluster, app_id, replica):
                        gone[replica] = time.time()
                stopper = cut if again is None or again[0] == other else other
                if again is not None and stopper in gone:
                    break
                time.sleep(0.1)
            out["again_s"] = None if again is None else round(again[1] - t_cut, 2)
            out["again_replica"] = None if again is None else again[0]
            stopped = cut if again is None or again[0] == other else other
            out["stopped_replica"] = stopped
            out["stopped_s"] = round(gone[stopped] - t_cut, 2) if stopped in gone else None
            out["workers_gone_s"] = {str(r): round(t - t_cut, 2) for r, t in sorted(gone.items())}
        else:
            name = pods[other]["metadata"]["name"]
            ended = wait_for(lambda: _terminated(cluster.get("pods", name)), window, 0.2)
            out["fail_s"] = round(time.time() - t_cut, 2) if ended else None
            if ended:
                out["exit_code"] = ended.get("exitCode")
                result = work / f"result.{other}.json"
                wait_for(result.exists, 5.0)
                message = result.read_text() if result.exists() else ended.get("message") or ""
                out["message"] = _root_cause(message)
    finally:
        finish(cluster, app_id, objs, work, node)
    return out


def finish(cluster: Cluster, app_id: str, objs: list[dict[str, Any]], work: Path, node: str | None) -> None:
    """The end of a run: ``node`` healed (when one was partitioned), each pod's log kept in
    ``work`` (what each launcher said, for the reader), the objects and pods removed."""
    if node is not None:
        cluster.server.node(node, "heal")
    for i, pod in _pods(cluster, app_id).items():
        try:
            (work / f"pod.{i}.log").write_text(cluster.log(pod["metadata"]["name"]))
        except OSError:
            pass
    remove(cluster, app_id, objs)


def create_two(
    cluster: Cluster, app_id: str, objs: list[dict[str, Any]], count: int = 2
) -> dict[int, dict[str, Any]] | None:
    """Create the rendered objects; the Job's ``count`` pods (two) by index once all are
    scheduled (``None`` when they were not within 60 s).

    Raises:
        RuntimeError: the API server refused an object.
    """
    for obj in objs:
        made = cluster.create(obj)
        if made.get("kind") != obj["kind"]:
            raise RuntimeError(f"creating {obj['kind']} failed: {made}")
    found: dict[int, dict[str, Any]] | None = wait_for(
        lambda: len(p := _pods(cluster, app_id)) == count and all(x["spec"].get("nodeName") for x in p.values()) and p,
        60,
    )
    return found


def remove(cluster: Cluster, app_id: str, objs: list[dict[str, Any]]) -> None:
    """Delete the rendered objects and every pod of the run, and wait until the pods are gone."""
    for obj in reversed(objs):
        kind = {"Job": "jobs", "Service": "services", "NetworkPolicy": "networkpolicies"}[obj["kind"]]
        cluster.delete(kind, obj["metadata"]["name"], propagationPolicy="Background")
    for pod in cluster.items("pods", f"torchstep/app-id={app_id}"):
        cluster.delete("pods", pod["metadata"]["name"], gracePeriodSeconds=0)
    wait_for(lambda: not cluster.items("pods", f"torchstep/app-id={app_id}"), 60, 0.5)


def _root_cause(message: str) -> dict[str, Any] | str:
    """The termination message's state, retryable and root cause (torchstep-agent writes its
    result's summary), else its last line (torchrun: the log's tail)."""
    try:
        data = json.loads(message)
    except ValueError:
        lines = [x for x in message.splitlines() if x.strip()]
        return lines[-1][:200] if lines else ""
    root = data.get("root_cause") or {}
    return {"state": data.get("state"), "retryable": data.get("retryable"), "root_cause": root.get("message")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--tools", default=",".join(TOOLS))
    parser.add_argument("--only", default="", help="scenarios, e.g. elastic-cut1,fixed-cut0 (default: all four)")
    parser.add_argument("--json", action="store_true", help="print the rows only; record no figure")
    parser.add_argument("--work", default="", help="directory for the runs (default: a fresh temporary one)")
    parser.add_argument("--rows", default="", help="record the figures of the rows an earlier run printed (its log)")
    args = parser.parse_args()
    if args.rows:  # measured already: the rows' own window and runs go into the figures' command
        rows = [json.loads(x) for x in Path(args.rows).read_text().splitlines() if x.startswith("{")]
        _record(rows, args)
        return
    reason = missing()
    if reason:
        sys.exit(f"bench/silent_pods.py needs the one-machine cluster: {reason}")
    if args.work:
        Path(args.work).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="silent_pods.", dir=args.work or None))  # a fresh API server's files
    wanted = [(e, c) for e, c in FIGURES if not args.only or f"{'elastic' if e else 'fixed'}-cut{c}" in args.only]
    prefix = new_prefix()
    server = start_server(work / "api", real=cluster_config(work / "cluster", prefix))
    cluster = Cluster(server, work / "cluster", prefix=prefix)
    rows: list[dict[str, Any]] = []
    try:
        for elastic, cut in wanted:
            for run in range(args.runs):
                for tool in args.tools.split(",") if run % 2 == 0 else reversed(args.tools.split(",")):  # A/B/B/A
                    mode = "elastic" if elastic else "fixed"
                    try:
                        row = scenario(
                            cluster,
                            tool,
                            cut=cut,
                            elastic=elastic,
                            window=args.window,
                            work=work / f"{tool}-{mode}-cut{cut}-{run}",
                        )
                    except RuntimeError as e:  # the run could not measure (it never formed): said, not counted
                        row = {"tool": tool, "cut": cut, "elastic": elastic, "error": str(e)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
    finally:
        server.stop()
        cleanup(prefix, work / "cluster")
    if args.json:
        return
    _record(rows, args)
    print("\n| scenario | torchrun | torchstep-agent | ratio (torchrun / ours) |\n|---|---|---|---|")
    for (elastic, cut), (_, what) in FIGURES.items():
        key = "again_s" if elastic else "fail_s"
        cells, meds = [], []
        for tool in TOOLS:
            vals = [
                r.get(key)
                for r in rows
                if r["tool"] == tool and r["elastic"] == elastic and r["cut"] == cut and "error" not in r
            ]
            cells.append(fmt_seconds(vals, args.window) if vals else "-")
            got = [v for v in vals if v is not None]
            meds.append(statistics.median(got) if got and len(got) == len(vals) else args.window)
        ratio = f"{meds[0] / meds[1]:.0f}x+" if meds[1] else "-"
        print(f"| {what} | {cells[0]} | {cells[1]} | {ratio} |")


def _record(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """One figure per scenario (both launchers measured); a run that did not recover (or end)
    within the window counts as the window, a lower bound, and the note says so."""
    sys.path.insert(0, str(BENCH / "scripts"))
    from figures import _update, record

    for (elastic, cut), (fig, what) in FIGURES.items():
        key = "again_s" if elastic else "fail_s"
        mine = [r for r in rows if r["elastic"] == elastic and r["cut"] == cut and "error" not in r]
        vals = {tool: [r.get(key) for r in mine if r["tool"] == tool] for tool in TOOLS}
        if not all(vals.values()):
            continue
        notes = []
        for tool, got in vals.items():
            missing_runs = sum(1 for v in got if v is None)
            if missing_runs:
                notes.append(
                    f"{tool}: {missing_runs} of {len(got)} runs had not {'recovered' if elastic else 'ended'} "
                    f"after {args.window:g} s (counted as {args.window:g} s, a lower bound)"
                )
        ours = [r for r in mine if r["tool"] == "torchstep-agent"]
        if elastic:
            where = sorted({str(r.get("again_replica")) for r in ours})
            stopper = sorted({str(r.get("stopped_replica")) for r in ours})
            side = "cut side" if stopper == [str(cut)] else "the other side, cut off from the store"
            notes.append(
                f"torchstep-agent: world 1 on replica {'/'.join(where)}; replica {'/'.join(stopper)} ({side}) "
                "stopped its worker after "
                + ", ".join("never" if r.get("stopped_s") is None else f"{r['stopped_s']:.1f} s" for r in ours)
            )
        else:
            said = set()
            for r in ours:
                m = r.get("message") or {}
                if isinstance(m, dict):
                    cause = re.sub(r"silent-t-[0-9a-f]{8}", "silent-t-ID", str(m.get("root_cause")))
                    cause = re.sub(r"(_\d+_0|:\d+)\)", ")", cause)  # the run's pids and probe ports
                    said.add(f"{m.get('state')}, retryable {m.get('retryable')}: {cause[:300]}")
                else:
                    said.add(str(m)[:160])
            notes.append("torchstep-agent's result: " + "; ".join(sorted(said)))
            notes.append(
                "the Job's backoffLimit is 1 for both launchers (see bench/silent_pods.py: this cluster's partitioned kubelet still reports)"
            )
        if elastic:
            alive = [r for r in mine if r["tool"] == "torchrun" and r.get("stopped_s") is None]
            if alive:
                notes.append(
                    f"torchrun: the cut replica's worker still ran after {args.window:g} s in "
                    f"{len(alive)} of {len(vals['torchrun'])} runs"
                )
        if (elastic, cut) == (True, 0) and any(r.get("again_replica") == 1 for r in ours):
            notes.append(
                "the run's Lease (store_witness) chose replica 1, which moved the store and trained on in its pod "
                "(replica 0 could not reach the API server behind its cut link)"
            )
        elif (elastic, cut) == (True, 0):  # without the witness: replica 0 trains on, after torch's lookups
            notes.append("20 s of torchstep-agent's are two DNS timeouts in torch's c10d client (see below)")
        loads = [r["load_1m"] for r in mine if r.get("load_1m") is not None]
        if loads:
            notes.append(
                f"1-minute load average at the cuts {min(loads):g}-{max(loads):g} on {os.cpu_count()} cores "
                "(other work shared the machine: a harsher setting, not a kinder one)"
            )
        row = record(
            fig,
            what,
            [args.window if v is None else v for v in vals["torchstep-agent"]],
            [args.window if v is None else v for v in vals["torchrun"]],
            peer_name="torchrun",
            goal=10.0 if elastic else 30.0,
            goal_on="ours",
            command=f"python bench/silent_pods.py --runs {args.runs} --window {args.window:g}",
            note="; ".join(notes),
        )
        if loads:  # the machine's load when it mattered: at the cuts, not when the figure was written
            row["machine"]["load_1m"] = max(loads)
            _update(fig, "figures", row)


if __name__ == "__main__":
    main()
