"""Surface ``kubernetes``: the kubernetes target (``torchstep.steps.KubernetesStep`` over
``JobGang`` and the official client) run by a watcher process against the one-machine cluster
of tests/cluster, whose pods run for real: the rendered Indexed Job's 2 pods (2 replicas x 2
ranks, checkpoints on a hostPath, numbered lines on every rank) each in its own network, UTS
and PID namespaces on one of 2 nodes, with cluster DNS; what is ours is only the API server
and its controllers. One cluster per campaign process, started on first use and stopped at
exit, or by tools/soak/kube_reaper.py when the process is killed first. Node faults: a drain,
a lost node, a partition.

The watcher is what an orchestrator's task process is: it runs the step with a file-backed
state store (the log cursor and the workload uids, as Airflow's task state store keeps
them) and prints every line on its console. Faults are injected at the moment rank
``run.rank`` printed line ``run.moment`` (its progress file on the hostPath; the rank waits
there until the fault is in, ``SOAK_HOLD_*``), through the API server's ``/debug`` endpoints
or a signal to the watcher. Invariant 7 (:func:`check`): never two gangs of one logical
attempt, and nothing of the run left on the cluster at the end (Jobs, pods, Services, pod
processes). Where the machine cannot run the cluster (not root, a tool missing:
``tests/cluster/harness.missing()``), :func:`unavailable` says why and the campaign skips
this surface's runs with that reason.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from tools.soak import closing, component, faults, invariants, procs
from tools.soak.model import Observation, Run

_TESTS = str(Path(__file__).resolve().parents[3] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

NAME = "kubernetes"
#: Runs of this surface share one cluster (started once per campaign process): the smoke runs
#: them one after the other on one worker.
SERVER = True
NODE_FAULTS = ("drain", "node_loss", "partition")
FAULTS = (
    "none",
    "api_500",
    "api_429",
    "watch_reset",
    "pod_deleted",
    "sigkill_watcher",
    "cancel",
    *NODE_FAULTS,
)
LINES = 12
#: The watcher's poll and log-cursor intervals (seconds): a SIGKILLed watcher's successor
#: shows again at most what was delivered after the last save.
POLL_S, CURSOR_S = 0.2, 0.5
#: API requests answered 500 under ``api_500``; 429 (``Retry-After: 1``) under ``api_429``.
N_500, N_429, RETRY_AFTER_S = 6, 4, 1
#: The harness's deadline for one watcher (a run takes 15-40 s; a lost node's replacement more).
DEADLINE_S = 240
#: A partition drawn with an even moment is healed this long after the cut; an odd one never
#: (until the run has ended).
HEAL_AFTER_S = 8.0
MANAGED = "app.kubernetes.io/managed-by=torchstep"
NODES = 2
#: A lost or partitioned node's run must end this soon after the fault: docs/agent.md's bound
#: for a fixed-size group (a silent peer or a cut-off store fails it within ~5 s) plus the
#: replacement pods' start and the rest of the lines on a loaded machine (31 s at most in the
#: 30-run campaign of docs/reliability.md). The agent's watchdog (60 s) ending a node whose
#: blocked store call was not cut is past it.
NODE_BOUND_S = 55.0

_LOSS = (
    "the replacement pods (`podFailurePolicy`: the lost pod's `DisruptionTarget` Ignored, the survivor's "
    "exit Counted within `backoffLimitPerIndex` 1) form the group again, resume after the checkpoint and "
    "the step SUCCEEDS; no line of a finished attempt lost or doubled, one Job, nothing left"
)

#: The outcome of each fault class on this surface (none of the local target's applies as is).
EXPECT = {
    "none": faults.Expect("SUCCEEDED", 0, 0, guarantee="no fault: every line once, one Job, everything deleted"),
    "api_500": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        guarantee=(
            f"the next {N_500} Kubernetes API requests are answered 500 mid-run: reads, lists, log streams and deletes "
            "are retried with backoff (JobGang's API retry budget, 60 s a call), the step SUCCEEDS, every line once, "
            "one Job, everything deleted at the end"
        ),
    ),
    "api_429": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        guarantee=(
            f"the next {N_429} API requests are answered 429 with `Retry-After: {RETRY_AFTER_S}` (API priority and "
            "fairness): retried after what the server asked, SUCCEEDED, every line once, one Job, nothing left"
        ),
    ),
    "watch_reset": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        guarantee=(
            "the followed pod-log streams are cut mid-way (connection closed without its last chunk): each follower "
            "reattaches with `sinceSeconds` and skips what it saw by timestamp; SUCCEEDED, no line lost or repeated"
        ),
    ),
    "pod_deleted": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        restarts_max=1,  # the surviving agent, when it saw its workers fail before the new round
        guarantee=(
            "a running pod is deleted under the watcher (`kubectl delete pod`): its agent is SIGTERMed (exit 143, "
            "`podFailurePolicy` Count), the Job controller replaces it within `backoffLimitPerIndex` (REPLICA, "
            "max_retries 1), the group re-forms, resumes after the checkpoint and JobGang follows the new pod's log "
            "and collects the latest pod of every index: SUCCEEDED, no line lost, one Job"
        ),
    ),
    "sigkill_watcher": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        guarantee=(
            "the watcher is SIGKILLed mid-run and the same step (run id, state store) is run again, as an "
            "orchestrator's retry: it attaches to the running Job (409, the recorded uid), never a second gang; its "
            f"log continues after the saved cursor (what came after the last save, {CURSOR_S:g} s here, is shown "
            "again, nothing lost), SUCCEEDED, everything deleted"
        ),
    ),
    "cancel": faults.Expect(
        "CANCELLED",
        128 + signal.SIGTERM,
        0,
        guarantee=(
            "SIGTERM to the watcher (the orchestrator cancels): CANCELLED, exit 143, the Job, its pods and Service "
            f"deleted and every pod process gone within grace + {faults.CANCEL_MARGIN_S:g} s"
        ),
    ),
    "drain": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        restarts_max=1,  # the surviving agent, when it saw its workers fail before the new round
        guarantee=(
            "the node of the faulty rank's pod is drained (cordoned, its pods evicted with `DisruptionTarget`): "
            "a preemption, not a failure: the Job controller replaces the pod on the other node without counting "
            "it (`podFailurePolicy` Ignore: the Job's `failed` stays 0, no retry spent), the result warns "
            "`preempted 1 time`, the group resumes after the checkpoint and SUCCEEDS; no line of a finished attempt "
            "lost or doubled, one Job, nothing left"
        ),
    ),
    "node_loss": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        restarts_max=1,  # the surviving agent, when it saw its workers fail before the new round
        guarantee=(
            "the node of the faulty rank's pod is lost (its pod processes SIGKILLed, its link cut, NotReady after "
            "the 2 s grace, its pods failed with `DisruptionTarget`): the survivor's liveness monitor finds the "
            "silent peer (or that it is cut off from the store) and ends FAILED, retryable, in seconds "
            "(docs/agent.md: fixed `--nnodes 2`); " + _LOSS
        ),
    ),
    "partition": faults.Expect(
        "SUCCEEDED",
        0,
        0,
        restarts_max=1,  # the surviving agent, when it saw its workers fail before the new round
        guarantee=(
            "the node of the faulty rank's pod is partitioned (its link down, its processes alive; healed "
            f"{HEAL_AFTER_S:g} s later when the moment is even, never when odd): both sides end FAILED, retryable, in "
            "seconds (a silent peer, or cut off from the store; docs/agent.md, fixed `--nnodes 2`), never a hang; "
            + _LOSS
        ),
    ),
}

WATCHER = r"""
import json, os, signal, sys
sys.path.insert(0, os.environ["SOAK_ROOT"])
import torchstep
from torchstep.kubernetes import OfficialClient
from torchstep.result import CANCELLED
from torchstep.steps import KubernetesStep
from torchx import specs
from tools.soak import component

kubeconfig, result_file, store_file, app_file = sys.argv[1:5]
poll_s, cursor_s = float(sys.argv[5]), float(sys.argv[6])
spec = json.loads(open(app_file).read())


class FileStore:  # the orchestrator's state between tries (Airflow's task state store), a private JSON file
    def get(self, key, default=None):
        try:
            with open(store_file) as f:
                return json.load(f).get(key, default)
        except FileNotFoundError:
            return default

    def set(self, key, value):
        data = {}
        if os.path.exists(store_file):
            with open(store_file) as f:
                data = json.load(f)
        data[key] = value
        fd = os.open(store_file + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(data))
        os.replace(store_file + ".tmp", store_file)


def write(record):
    fd = os.open(result_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(record))


app = component.soak(2, 2, env=spec["env"])
app.roles[0].mounts = [specs.BindMount(src_path=spec["shared"], dst_path="/soak")]
plan = torchstep.build_plan(app, target="kubernetes")
kube = OfficialClient.from_config(config_file=kubeconfig, in_cluster=False)
step = KubernetesStep(plan, run_id=spec["run_id"], cfg={"namespace": "ml"}, client=kube, poll_interval=poll_s,
                      on_line=lambda line: print(line, flush=True), cursor_store=FileStore())
step.job_gang().cursor_interval = cursor_s


def stop(signum, frame):
    raise KeyboardInterrupt  # the orchestrator cancels the step


signal.signal(signal.SIGTERM, stop)
try:
    result = step.run()
except KeyboardInterrupt:  # the orchestrator cancelled: the step stopped and deleted everything first
    result = step.jobs.result if step.jobs is not None else None
    if result is not None:
        write({**result.to_dict(), "attached": step.attached})
    sys.exit(128 + signal.SIGTERM)
except Exception as e:
    write({"error": f"{type(e).__name__}: {e}", "attached": step.attached})
    print(f"watcher: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)
write({**result.to_dict(), "attached": step.attached})
code = result.exit_code
sys.exit(0 if result.succeeded else 128 + signal.SIGTERM if result.state == CANCELLED
         else code if isinstance(code, int) and 0 < code < 256 else 1)
"""


def unavailable() -> str | None:
    """Why this machine cannot run the surface (the one-machine cluster's own check:
    root, network namespaces, bubblewrap, dnsmasq, a writable cgroup v1 memory controller),
    or None."""
    from cluster.harness import missing

    return missing()


class _Pods:
    """The campaign process's one cluster: the API server in ``--real`` mode and its reaper."""

    def __init__(self) -> None:
        import tempfile

        from cluster.controller import new_prefix
        from cluster.harness import Cluster, cluster_config
        from kubehttp import start_server

        self.home = Path(tempfile.mkdtemp(prefix="soakkube"))
        os.chmod(self.home, 0o700)
        self.prefix = new_prefix()
        root = self.home / "cluster"
        # the reaper first: whatever happens to this process from here on, it cleans up
        self.reaper = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve().parents[1] / "kube_reaper.py")],
            stdin=subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": _TESTS},
        )
        self._tell({"prefix": self.prefix, "root": str(root), "home": str(self.home)})
        server = start_server(self.home / "api", real=cluster_config(root, self.prefix, nodes=NODES))
        self._tell({"server": server.process.pid})
        self.cluster = Cluster(server, root, prefix=self.prefix)
        self.nodes = [f"node-{i}" for i in range(NODES)]

    def _tell(self, what: dict[str, Any]) -> None:
        assert self.reaper.stdin is not None
        self.reaper.stdin.write((json.dumps(what) + "\n").encode())
        self.reaper.stdin.flush()

    def close(self) -> None:
        """Stop the server (its pods, DNS, namespaces), remove what it left, end the reaper."""
        import shutil

        from cluster.kubelet import cleanup

        try:
            self.cluster.server.stop()
            cleanup(self.prefix, self.cluster.root)
            shutil.rmtree(self.home, ignore_errors=True)
        finally:
            self._tell({"done": True})
            assert self.reaper.stdin is not None
            self.reaper.stdin.close()
            self.reaper.wait(60)


_pods: _Pods | None = None


def _cluster() -> _Pods:
    """The campaign's cluster, started on first use (stopped when the campaign closes)."""
    global _pods
    if _pods is None:
        _pods = _Pods()
        closing.on_close(_close)
    return _pods


def _close() -> None:
    global _pods
    if _pods is not None:
        pods, _pods = _pods, None
        pods.close()


def _progress(shared: Path, rank: int) -> int:
    seen = faults.progress_of(shared / "progress", rank)
    return -1 if seen is None else seen[1]


def _node_of(pods: _Pods, index: int) -> tuple[str | None, str | None]:
    """(pod name, node) of the running pod of completion index ``index``."""
    for pod in pods.cluster.items("pods", MANAGED):
        ann = pod["metadata"].get("annotations") or {}
        if (
            ann.get("batch.kubernetes.io/job-completion-index") == str(index)
            and pod["status"].get("phase") == "Running"
            and "deletionTimestamp" not in pod["metadata"]
        ):
            return pod["metadata"]["name"], pod["spec"].get("nodeName")
    return None, None


def _watch(workdir: Path, name: str, pods: _Pods, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a watcher process; its console goes to ``<name>.console``."""
    console = workdir / f"{name}.console"
    fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        argv = [
            sys.executable,
            str(workdir / "watcher.py"),
            str(pods.cluster.kubeconfig),
            str(workdir / f"{name}.json"),
            str(workdir / "store.json"),
            str(workdir / "app.json"),
            str(POLL_S),
            str(CURSOR_S),
        ]
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    return proc, console


def _wait(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Wait for ``proc``; False (and it is SIGKILLed) when it outlived ``seconds``."""
    try:
        proc.wait(timeout=max(seconds, 1.0))
        return True
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return False


def _inject(run: Run, pods: _Pods, proc: subprocess.Popen[bytes], shared: Path, acted: dict[str, Any]) -> bool:
    """Wait for the moment, then inject ``run.fault`` (False: the watcher ended first, or
    there was nothing to act on). ``acted`` records the node acted on."""
    server = pods.cluster.server
    index = run.rank // faults.NPROC
    while proc.poll() is None:
        if _progress(shared, run.rank) >= run.moment:
            if run.fault == "api_500":
                server.fault(status=500, count=N_500)
            elif run.fault == "api_429":
                server.fault(status=429, count=N_429, retry_after=RETRY_AFTER_S)
            elif run.fault == "watch_reset":
                server.fault(cut_logs=faults.REPLICAS)
            elif run.fault == "pod_deleted":
                return server.fault(delete_pod=index)["pod"] is not None
            elif run.fault == "sigkill_watcher":
                return faults.kill(proc.pid, signal.SIGKILL)
            elif run.fault == "cancel":
                return faults.kill(proc.pid, signal.SIGTERM)
            elif run.fault in NODE_FAULTS:
                pod, node = _node_of(pods, index)
                if node is None:
                    return False
                action = {"drain": "drain", "node_loss": "lose", "partition": "partition"}[run.fault]
                server.node(node, action)
                acted.update(node=node, pod=pod, at=time.monotonic())
            return True
        time.sleep(0.02)
    return False


def _splice(first: str, second: str) -> tuple[str, dict[int, int]]:
    """The console a rerun's user reads as one log: the first watcher's lines, less those of
    each worker the second shows again (from the first line it shows of that worker), then
    the second's. Returns it and, per pid, how many lines were shown twice."""
    seq = invariants.numbered(second)
    resumed = {pid: items[0][1] for pid, items in seq.items() if items}
    kept: list[str] = []
    repeated: defaultdict[int, int] = defaultdict(int)
    for raw in first.splitlines():
        m = invariants.LINE.search(raw)
        if m and int(m[3]) in resumed and int(m[4]) >= resumed[int(m[3])]:
            repeated[int(m[3])] += 1
            continue
        kept.append(raw)
    return "\n".join(kept) + "\n" + second, dict(repeated)


def _result(path: Path, notes: list[str]) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        notes.append(f"{path.name} unreadable: {e}")
        return None
    if "error" in record:
        notes.append(f"the watcher failed: {record['error']}")
        return None
    return dict(record)


def _left(pods: _Pods, within: float = 30.0) -> tuple[list[str], list[int]]:
    """What torchstep made still on the cluster (runs go one after the other: all of it is
    this run's) and the pods' processes still alive, after waiting up to ``within`` seconds
    for them to go."""
    deadline = time.monotonic() + within
    while True:
        objects = [
            f"{kind}/{o['metadata']['name']}"
            for kind in ("jobs", "pods", "services")
            for o in pods.cluster.items(kind, MANAGED)
        ]
        alive = sorted(pods.cluster.pod_processes())
        if (not objects and not alive) or time.monotonic() > deadline:
            return objects, alive
        time.sleep(0.2)


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Run the soak step on the one-machine cluster's real pods under ``run``'s fault.

    Args:
        run: the planned run.
        seed: the campaign's seed (unused: the plan holds every draw).
        workdir: a fresh private directory for this run.

    Returns:
        What was observed (``extra``: the API server's counters of this run, the objects and
        pod processes left, the Job's final counts, the repeats after a reattach).
    """
    del seed
    pods = _cluster()
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(workdir / "watcher.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(WATCHER)
    shared = workdir / "shared"  # the pods' hostPath: the checkpoint and the progress files
    for sub in ("ckpt", "progress"):
        (shared / sub).mkdir(mode=0o700, parents=True)
    token = uuid.uuid4().hex
    run_id = f"soak-{run.index}-{token[:6]}"
    hold = (
        {}
        if run.fault == "none"
        else {
            "SOAK_HOLD_RANK": str(run.rank),
            "SOAK_HOLD_LINE": str(run.moment),
            "SOAK_HOLD_MAX_S": str(faults.HOLD_MAX_S),
        }
    )
    role_env = {
        "SOAK_MARK": token,  # the pods' processes carry it too: the /proc scan finds them
        "SOAK_CKPT": "/soak/ckpt",
        "SOAK_PROGRESS": "/soak/progress",
        "SOAK_WORKER_ID": "random",
        "PYTHONUNBUFFERED": "1",
        **hold,
        **faults.tail_env("cancel" if run.fault == "cancel" else "none"),
    }
    (workdir / "app.json").write_text(json.dumps({"env": role_env, "shared": str(shared), "run_id": run_id}))
    root = str(Path(component.__file__).resolve().parents[2])
    env = dict(os.environ, SOAK_MARK=token, SOAK_ROOT=root, PYTHONUNBUFFERED="1")
    notes: list[str] = []
    extra: dict[str, Any] = {"repeated": {}}
    acted: dict[str, Any] = {}
    before = pods.cluster.server.state()
    started = time.monotonic()
    hung = False
    healed = False
    try:
        proc, console = _watch(workdir, "first", pods, env)
        injected = True
        try:
            if run.fault != "none":
                injected = _inject(run, pods, proc, shared, acted)
        finally:
            faults.release(shared / "progress")
        sent = time.monotonic()
        if run.fault == "partition" and acted and run.moment % 2 == 0:
            try:
                proc.wait(timeout=HEAL_AFTER_S)
            except subprocess.TimeoutExpired:
                pass
            pods.cluster.server.node(acted["node"], "heal")
            healed = True
            notes.append(f"partition: {acted['node']} healed {time.monotonic() - sent:.1f} s after the cut")
        if run.fault == "cancel" and injected:
            hung = not _wait(proc, faults.GRACE_S + faults.CANCEL_MARGIN_S)
            notes.append(
                f"cancel: {'still running' if hung else 'ended'} {time.monotonic() - sent:.1f} s after SIGTERM"
            )
        hung = hung or not _wait(proc, DEADLINE_S - (time.monotonic() - started))
        final, text = proc, console.read_text(errors="replace")
        name = "first"
        if run.fault == "sigkill_watcher" and injected:
            again, console2 = _watch(workdir, "second", pods, env)  # the orchestrator's retry of the step
            hung = hung or not _wait(again, DEADLINE_S)
            final, name = again, "second"
            text, extra["repeated"] = _splice(text, console2.read_text(errors="replace"))
        if acted:
            extra["after_fault_s"] = time.monotonic() - acted["at"]
            notes.append(
                f"{run.fault}: {acted['node']} (pod {acted['pod']}); the run ended "
                f"{time.monotonic() - acted['at']:.1f} s later"
            )
        if hung:
            notes.append(f"the watcher was still running at the harness's deadline ({DEADLINE_S} s)")
        duration = time.monotonic() - started
        result = _result(workdir / f"{name}.json", notes)
        after = pods.cluster.server.state()
        extra["state"] = {
            k: after[k] - before.get(k, 0)
            for k in after
            if isinstance(after[k], int) and not isinstance(after[k], bool)
        }
    finally:
        if acted:  # the node back for the next run: uncordoned, reconnected, or a lost one restored
            action = "restore" if run.fault == "node_loss" else "heal"
            if not (healed and action == "heal"):
                pods.cluster.server.node(acted["node"], action)
    objects, alive = _left(pods)
    extra["left"] = objects
    extra["pod_processes"] = alive
    if alive:  # never leave them to the next run
        for pid in alive:
            faults.kill(pid, signal.SIGKILL)
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    counters = extra["state"]
    if run.fault in ("api_500", "api_429"):
        injected = injected and counters.get("faults_answered", 0) > 0
        notes.append(f"{counters.get('faults_answered', 0)} API requests answered {run.fault[4:]}")
    elif run.fault == "watch_reset":
        injected = injected and counters.get("streams_cut", 0) > 0
        notes.append(f"{counters.get('streams_cut', 0)} log streams cut")
    if extra["repeated"]:
        notes.append(f"shown again after the reattach (per pid): {extra['repeated']}")
    if not injected and run.fault != "none":
        notes.append(f"the run ended before rank {run.rank} reached line {run.moment}: fault not injected")
    if result is not None:
        extra["attached"] = result.pop("attached", None)
    return Observation(
        rc=final.returncode,
        duration_s=duration,
        result=result,
        result_source="result file" if result is not None else "none",
        console=text,
        run_dir=None,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        extra=extra,
    )


def check(run: Run, obs: Observation) -> list[tuple[str, str]]:
    """Invariant 7: one gang of the logical attempt (one Job created by the run; a rerun
    attaches: 409s allowed), nothing of the run left on the cluster at the end (its Job,
    pods, Service, and no pod process alive), after a reattach no more lines shown again
    than the cursor's window; and what each fault class calls for: a drain is a preemption
    (the result warns of it, not a retry: attempts 1), a deleted or lost pod was replaced and
    its group resumed after the checkpoint (every worker started after the fault begins past
    line 0), a lost or partitioned node's run ended within ``NODE_BOUND_S`` of the fault.

    Args:
        run: the planned run.
        obs: what :func:`run` observed.

    Returns:
        ``("7", detail)`` for each thing that does not hold.
    """
    state = obs.extra.get("state")
    if state is None:
        return [("7", "no state of the API server was read")]
    bad = []
    if state.get("jobs_created") != 1 or state.get("services_created") != 1:  # the Job's pods are its own
        bad.append(f"{state.get('jobs_created')} Jobs and {state.get('services_created')} Services for one attempt")
    if obs.extra.get("left"):
        bad.append(f"left on the cluster after the step ended: {obs.extra['left']}")
    if obs.extra.get("pod_processes"):
        bad.append(f"pod processes alive 30 s after the step ended: {obs.extra['pod_processes']}")
    if run.fault == "sigkill_watcher" and obs.injected:
        if obs.extra.get("attached") is not True or state.get("conflicts", 0) < 1:
            bad.append(
                f"the rerun did not attach (attached={obs.extra.get('attached')}, {state.get('conflicts')} 409s)"
            )
        window = int((CURSOR_S + POLL_S + 1.0) / 0.2) + 2  # the last save, the kill's latency (a line per 0.2 s)
        over = {pid: n for pid, n in obs.extra.get("repeated", {}).items() if n > window}
        if over:
            bad.append(f"lines shown again after the reattach beyond the cursor's window ({window}): {over}")
    res = obs.result or {}
    if run.fault == "drain" and obs.injected:
        if not any(str(w).startswith("preempted 1 time") for w in res.get("warnings") or []):
            bad.append(f"a drain is a preemption, the result does not say so: warnings {res.get('warnings')}")
        if state.get("evictions", 0) < 1:
            bad.append("the drain evicted no pod")
    if run.fault in ("pod_deleted", *NODE_FAULTS) and obs.injected and res.get("state") == "SUCCEEDED":
        firsts = [items[0][1] for items in invariants.numbered(obs.console).values() if items]  # in print order
        later = firsts[faults.WORLD :]  # the workers of the group formed again after the fault
        if not later:
            bad.append("no worker group started again after the fault")
        elif min(later) == 0:
            bad.append(f"a worker started after the fault began at line 0, not after the checkpoint: {later}")
    after = obs.extra.get("after_fault_s")
    if run.fault in ("node_loss", "partition") and obs.injected and after is not None and after > NODE_BOUND_S:
        bad.append(
            f"the run ended {after:.0f} s after the node went silent, past the {NODE_BOUND_S:g} s bound (docs/agent.md: "
            "a fixed-size group fails within ~5 s of a silent peer or a cut-off store, then the replacements run)"
        )
    return [("7", b) for b in bad]
