"""Surface ``kubernetes``: the kubernetes target (``torchstep.steps.KubernetesStep`` over
``JobGang`` and the official client) run by a watcher process against the cross-process
fake API of tests/kubehttp.py — no cluster exists here, its pods are simulated by the wall
clock: 2 replicas (an Indexed Job) x 2 ranks, each rank printing the soak job's numbered
lines ``soak rank=R attempt=A pid=P line=N`` (a fake pid per rank and pod incarnation).

The watcher is what an orchestrator's task process is: it runs the step with a file-backed
state store (the log cursor and the workload uids, as Airflow's task state store keeps
them) and prints every line on its console. Faults are injected at the moment rank
``run.rank`` printed line ``run.moment`` on that console, through the fake's
``POST /debug/fault`` or a signal to the watcher. Invariant 7 (:func:`check`): never two
gangs of one logical attempt, and nothing of the run left on the "cluster" at the end.
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

from tools.soak import component, faults, invariants, procs
from tools.soak.model import Observation, Run

_TESTS = str(Path(__file__).resolve().parents[3] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

from kubehttp import KubeServer, Scenario, start_server  # noqa: E402

NAME = "kubernetes"
FAULTS = ("none", "api_500", "api_429", "watch_reset", "pod_deleted", "sigkill_watcher", "cancel")
LINES, INTERVAL_S = 12, 0.25
#: The watcher's poll and log-cursor intervals (seconds): a SIGKILLed watcher's successor
#: shows again at most what was delivered after the last save.
POLL_S, CURSOR_S = 0.2, 0.5
#: API requests answered 500 under ``api_500``; 429 (``Retry-After: 1``) under ``api_429``.
N_500, N_429, RETRY_AFTER_S = 6, 4, 1
#: The harness's deadline for one watcher (a run is far shorter: seconds).
DEADLINE_S = 120
TEMPLATE = "[soak/{rank}] soak rank={rank} attempt={attempt} pid={pid} line={line}"
LABEL = "torchstep/app-id"

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
        None,
        guarantee=(
            "a running pod is deleted under the watcher (`kubectl delete pod`): its agent is SIGTERMed (exit 143, "
            "`podFailurePolicy` Count), the Job controller replaces it within `backoffLimitPerIndex` (REPLICA, "
            "max_retries 1), the replacement resumes after the checkpoint and JobGang follows its log and collects "
            "the latest pod of every index: SUCCEEDED, no line lost, one Job (restarts are the fake pods' own "
            "agents' count: not compared)"
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
            f"deleted within grace + {faults.CANCEL_MARGIN_S:g} s"
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
from tools.soak import component

kubeconfig, result_file, store_file = sys.argv[1:4]
poll_s, cursor_s = float(sys.argv[4]), float(sys.argv[5])


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


plan = torchstep.build_plan(component.soak(2, 2), target="kubernetes")
kube = OfficialClient.from_config(config_file=kubeconfig, in_cluster=False)
step = KubernetesStep(plan, run_id="soak-1", cfg={"namespace": "ml"}, client=kube, poll_interval=poll_s,
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


def _scenario(fault: str) -> Scenario:
    """The fake cluster's pods: LINES lines per rank, every index succeeding with a result."""
    from torchstep.result import StepResult

    ok = StepResult(app_id="soak", state="SUCCEEDED", exit_code=0).summary()
    run_s = LINES * INTERVAL_S + 0.5 + (60 if fault == "cancel" else 0)  # cancel: still running when it lands
    return Scenario(
        replicas=faults.REPLICAS,
        run_s=run_s,
        lines=LINES,
        line_interval_s=INTERVAL_S,
        line_template=TEMPLATE,
        procs=faults.NPROC,
        messages=[ok] * faults.REPLICAS,
    )


def _reached(console: Path, rank: int, moment: int) -> bool:
    try:
        text = console.read_text(errors="replace")
    except OSError:
        return False
    return any(r == rank and n >= moment for seq in invariants.numbered(text).values() for r, n in seq)


def _watch(workdir: Path, name: str, server: KubeServer, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path]:
    """Start a watcher process; its console goes to ``<name>.console``."""
    console = workdir / f"{name}.console"
    fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        argv = [
            sys.executable,
            str(workdir / "watcher.py"),
            str(server.kubeconfig),
            str(workdir / f"{name}.json"),
            str(workdir / "store.json"),
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


def _inject(run: Run, server: KubeServer, proc: subprocess.Popen[bytes], console: Path) -> bool:
    """Wait for the moment, then inject ``run.fault`` (False: the watcher ended first)."""
    while proc.poll() is None:
        if _reached(console, run.rank, run.moment):
            if run.fault == "api_500":
                server.fault(status=500, count=N_500)
            elif run.fault == "api_429":
                server.fault(status=429, count=N_429, retry_after=RETRY_AFTER_S)
            elif run.fault == "watch_reset":
                server.fault(cut_logs=faults.REPLICAS)
            elif run.fault == "pod_deleted":
                return server.fault(delete_pod=run.rank // faults.NPROC)["pod"] is not None
            elif run.fault == "sigkill_watcher":
                return faults.kill(proc.pid, signal.SIGKILL)
            elif run.fault == "cancel":
                return faults.kill(proc.pid, signal.SIGTERM)
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


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Run the soak step on the fake cluster under ``run``'s fault.

    Args:
        run: the planned run.
        seed: the campaign's seed (unused: the plan holds every draw).
        workdir: a fresh private directory for this run.

    Returns:
        What was observed (``extra``: the fake's counters and objects at the end, the
        repeats after a reattach).
    """
    del seed
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(workdir / "watcher.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(WATCHER)
    token = uuid.uuid4().hex
    root = str(Path(component.__file__).resolve().parents[2])
    env = dict(os.environ, SOAK_MARK=token, SOAK_ROOT=root, PYTHONUNBUFFERED="1")
    notes: list[str] = []
    extra: dict[str, Any] = {"repeated": {}}
    server = start_server(workdir / "api", _scenario(run.fault))
    started = time.monotonic()
    hung = False
    try:
        proc, console = _watch(workdir, "first", server, env)
        injected = True
        if run.fault != "none":
            injected = _inject(run, server, proc, console)
        sent = time.monotonic()
        if run.fault == "cancel" and injected:
            hung = not _wait(proc, faults.GRACE_S + faults.CANCEL_MARGIN_S)
            notes.append(
                f"cancel: {'still running' if hung else 'ended'} {time.monotonic() - sent:.1f} s after SIGTERM"
            )
        hung = hung or not _wait(proc, DEADLINE_S - (time.monotonic() - started))
        final, text = proc, console.read_text(errors="replace")
        name = "first"
        if run.fault == "sigkill_watcher" and injected:
            again, console2 = _watch(workdir, "second", server, env)  # the orchestrator's retry of the step
            hung = hung or not _wait(again, DEADLINE_S)
            final, name = again, "second"
            text, extra["repeated"] = _splice(text, console2.read_text(errors="replace"))
        if hung:
            notes.append(f"the watcher was still running at the harness's deadline ({DEADLINE_S} s)")
        duration = time.monotonic() - started
        result = _result(workdir / f"{name}.json", notes)
        extra["state"] = server.state()
    finally:
        server.stop()
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    counters = extra["state"]
    if run.fault in ("api_500", "api_429"):
        injected = injected and counters["faults_answered"] > 0
        notes.append(f"{counters['faults_answered']} API requests answered {run.fault[4:]}")
    elif run.fault == "watch_reset":
        injected = injected and counters["streams_cut"] > 0
        notes.append(f"{counters['streams_cut']} log streams cut")
    elif run.fault == "pod_deleted":
        notes.append(f"{counters['pods_replaced']} pod(s) replaced by the Job controller")
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
    """Invariant 7: one gang of the logical attempt (``jobs_created`` equals the roles'
    count: 1; a rerun attaches: 409s allowed), nothing of the run left on the fake cluster
    at the end, and after a reattach no more lines shown again than the cursor's window.

    Args:
        run: the planned run.
        obs: what :func:`run` observed.

    Returns:
        ``("7", detail)`` for each thing that does not hold.
    """
    state = obs.extra.get("state")
    if not state:
        return [("7", "no state of the fake API server was read")]
    bad = []
    if state["jobs_created"] != 1 or state["pods_created"] != 0:
        bad.append(f"{state['jobs_created']} Jobs and {state['pods_created']} bare Pods created for one attempt")
    left = [f"{o['kind']}/{o['name']}" for o in state["objects"] if o["labels"].get(LABEL)]
    if left:
        bad.append(f"left on the cluster after the step ended: {left}")
    if run.fault == "sigkill_watcher" and obs.injected:
        if obs.extra.get("attached") is not True or state["conflicts"] < 1:
            bad.append(f"the rerun did not attach (attached={obs.extra.get('attached')}, {state['conflicts']} 409s)")
        window = int((CURSOR_S + POLL_S + 1.0) / INTERVAL_S) + 2  # the last save, the kill's latency
        over = {pid: n for pid, n in obs.extra.get("repeated", {}).items() if n > window}
        if over:
            bad.append(f"lines shown again after the reattach beyond the cursor's window ({window}): {over}")
    if run.fault == "pod_deleted" and obs.injected and state["pods_replaced"] < 1:
        bad.append("the deleted pod was not replaced")
    return [("7", b) for b in bad]
