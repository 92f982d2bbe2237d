"""Surface ``prefect``: the soak component as a torchstep Prefect task (``app_task``) in a
flow served by a long-lived ``flow.serve()`` Runner (tools/soak/prefect_flow.py), against a
real ``prefect server``. One server and one Runner per campaign process, started on first
use in a private temporary directory (``PREFECT_HOME``, SQLite database, analytics and UI
off) and stopped when the process exits.

Each run is one flow run created through the API (``create_flow_run`` of the deployment
``soak/soak``); the Runner executes it in a process of its own (a spawn child of the
Runner), which runs the task, whose step runs the agents as its children: that flow-run
process is "the process watching the step". What the harness reads back, all from Prefect:

- the final state: the task run's state type as a step state (COMPLETED -> SUCCEEDED,
  FAILED -> FAILED, CANCELLED -> CANCELLED, anything else as Prefect names it), and the flow
  run's, which must agree with it (:func:`check`);
- the tries: the task run's and the flow run's ``run_count`` (the soak AppDef is
  REPLICA-retried: the agents own the budget, Prefect's ``retries`` is 0, so each must be 1);
- the console: the task run's logs from the API (``/logs/filter``, by timestamp: every
  rank's line reaches the task run's logger in the order the step read it);
- the result record: the step's ``result.json`` (``<log_dir>/<app_id>/result.json``), which
  must agree with what the task returned or raised (the flow's record, :func:`check`);
- ``rc``: the step's exit code (the result's) when there is a result, else the flow-run
  process's exit status as the Runner reports it in the flow run's logs.

How the external faults are injected:

- ``sigkill_watcher``: the flow-run process (its pid from the flow's pid file) SIGKILLed.
  The Runner sees its process exit -9 and marks the flow run CRASHED; the task run stays
  RUNNING (nothing is left to end it: Prefect shows a task of a crashed flow run as it last
  heard of it); the agents see their parent die and stop every process of the step.
- ``cancel``: ``prefect flow-run cancel <id>`` (the CLI): the flow run goes CANCELLING,
  the Runner SIGTERMs the flow-run process, the task stops the step (grace period), sets
  the task run Cancelled and aborts; the Runner marks the flow run CANCELLED. The flow-run
  process must end within ``GRACE_S + CANCEL_MARGIN_S`` of the CLI's return.
- ``sigkill_agent``: an agent (a child of the flow-run process) SIGKILLed: replaced from
  the budget.

In-worker faults (``exit``, ``nonretryable``, ``flood``) reach the workers through the
flow's ``env`` parameter.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.soak import closing, faults, procs, runkit
from tools.soak.model import Observation, Run

NAME = "prefect"
FAULTS = ("none", "exit", "nonretryable", "sigkill_agent", "sigkill_watcher", "cancel", "flood")
LINES, INTERVAL_S = 10, 0.15
#: One server per campaign process: the smoke runs of this surface share one xdist worker.
SERVER = True
ROOT = Path(__file__).resolve().parents[3]
PREFECT = str(Path(sys.executable).with_name("prefect"))
#: Seconds the server and the Runner have to start (2 shared cores, other jobs beside).
SERVER_START_S, RUNNER_START_S = 180.0, 120.0
#: Seconds the Runner has to start a flow run's process once the run exists.
START_S = 90.0
#: Seconds Prefect has to settle a flow run's final state and logs after its process ended.
SETTLE_S = 60.0
#: Prefect's final state types, and the step states they stand for.
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "CRASHED")
AS_STEP = {"COMPLETED": "SUCCEEDED", "FAILED": "FAILED", "CANCELLED": "CANCELLED"}
#: The Runner's message on a flow run it marks CRASHED because its process exited non-zero.
#: Where the server's private directory goes: this process's temporary directory as it was
#: at import (a test may point TMPDIR at a directory it removes after each run).
TMP_ROOT = os.environ.get("TMPDIR") or "/tmp"
EXITED = re.compile(r"Process exited with status code: (-?\d+)")

#: Where this surface's outcome differs from the local target's (faults.FAULTS).
EXPECT = {
    "sigkill_watcher": dataclasses.replace(
        faults.FAULTS["sigkill_watcher"][1],
        state="RUNNING",
        guarantee=(
            "the flow-run process (the Runner's child running the task) is SIGKILLed: the Runner marks the "
            "flow run CRASHED (exit -9); the task run stays RUNNING, as Prefect last heard of it; the agents "
            "see their parent die and stop every process of the step within 15 s; no result can be written "
            "by the dead process"
        ),
    ),
}


def _free_port() -> int:
    from netlib import free_port  # tests/netlib.py (tools.soak.procs puts tests/ on sys.path)

    return int(free_port())


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file ``path``, mode 0600, never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, wait: float = 30.0) -> None:
    """Stop ``proc``'s process group: ``sig``, then SIGKILL after ``wait`` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=wait)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


class Prefect:
    """A ``prefect server`` and the soak flow's Runner, in a private temporary directory.

    Args:
        home: the private directory (PREFECT_HOME, the database, the logs).
    """

    def __init__(self, home: Path) -> None:
        import httpx

        self.home = home
        self.port = _free_port()
        self.api = f"http://127.0.0.1:{self.port}/api"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SOAK_"))}
        self.env = {
            **base,
            "PREFECT_HOME": str(home / "home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_API_URL": self.api,
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
            "PREFECT_RUNNER_POLL_FREQUENCY": "1",
            "XDG_STATE_HOME": str(home / "state"),
            "TMPDIR": str(home / "tmp"),
            # Prefect 3.7 keeps these in ~/.prefect whatever PREFECT_HOME says; a failed
            # task's exception (the step result inside StepFailed) is pickled to the first
            "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "storage"),
            "PREFECT_MEMO_STORE_PATH": str(home / "memo_store.toml"),
            "PYTHONUNBUFFERED": "1",
        }
        self.http = httpx.Client(base_url=self.api, timeout=30)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.runner_log = home / "runner.log"
        self.deployment = ""
        #: API requests retried so far (the run's notes say how many were its own).
        self.retried = 0

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """``method path`` on the API, the JSON answer; retried as Prefect's own client
        retries (a 429 or 5xx, a dropped connection: SQLite says "database is locked" as a
        503 on a busy machine), up to about a minute.

        Args:
            method: ``GET`` or ``POST``.
            path: the path under ``/api``.
            kwargs: ``json=`` and friends, for httpx.

        Returns:
            The decoded JSON body.
        """
        import httpx

        for delay in (0.5, 1, 2, 4, 8, 15, 30, None):
            try:
                r = self.http.request(method, path, **kwargs)
                if r.status_code not in (429, 500, 502, 503, 504) or delay is None:
                    r.raise_for_status()
                    return r.json()
            except httpx.TransportError:
                if delay is None:
                    raise
            self.retried += 1
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _start(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            proc = subprocess.Popen(
                argv, stdout=fd, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
            )
        finally:
            os.close(fd)
        self.procs.append(proc)
        return proc

    def _wait(self, pred: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen[bytes]) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = pred()
            except Exception:  # the server is not up yet
                value = None
            if value:
                return value
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: the process exited {proc.returncode} (see {self.home})")
            time.sleep(0.5)
        raise RuntimeError(f"{what}: not ready after {timeout:g} s (see {self.home})")

    def start(self) -> None:
        """Start the server, then the Runner serving the soak flow; wait for the deployment."""
        server = self._start(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            self.home / "server.log",
            self.env,
        )
        self._wait(lambda: self.http.get("/health").status_code == 200, SERVER_START_S, "prefect server", server)
        runner = self._start([sys.executable, "-m", "tools.soak.prefect_flow"], self.runner_log, self.env)

        def deployment() -> str | None:
            r = self.http.get("/deployments/name/soak/soak")
            return str(r.json()["id"]) if r.status_code == 200 else None

        self.deployment = self._wait(deployment, RUNNER_START_S, "the soak flow's Runner", runner)

    @property
    def runner_pid(self) -> int:
        """The Runner's pid."""
        return self.procs[1].pid

    def stop(self) -> None:
        """Stop the Runner, then the server (SIGTERM to each process group, SIGKILL after 30 s)."""
        for proc in reversed(self.procs):
            _stop(proc)
        self.http.close()

    def create_run(self, parameters: dict[str, Any]) -> str:
        """A new flow run of the soak deployment; its id."""
        body = {"parameters": parameters, "idempotency_key": uuid.uuid4().hex}  # a retry creates no second run
        return str(self.request("POST", f"/deployments/{self.deployment}/create_flow_run", json=body)["id"])

    def flow_run(self, run_id: str) -> dict[str, Any]:
        """The flow run as the API shows it."""
        return dict(self.request("GET", f"/flow_runs/{run_id}"))

    def task_runs(self, run_id: str) -> list[dict[str, Any]]:
        """The flow run's task runs."""
        return list(self.request("POST", "/task_runs/filter", json={"flow_runs": {"id": {"any_": [run_id]}}}))

    def logs(self, run_id: str) -> list[dict[str, Any]]:
        """Every log of the flow run (its tasks' and the Runner's), oldest first."""
        out: list[dict[str, Any]] = []
        while True:
            page = list(
                self.request(
                    "POST",
                    "/logs/filter",
                    json={
                        "logs": {"flow_run_id": {"any_": [run_id]}},
                        "sort": "TIMESTAMP_ASC",
                        "offset": len(out),
                        "limit": 200,
                    },
                )
            )
            out += page
            if len(page) < 200:
                return out

    def artifacts(self, run_id: str) -> list[dict[str, Any]]:
        """The flow run's artifacts (key, type, data)."""
        return list(self.request("POST", "/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}))

    def cancel(self, run_id: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        """``prefect flow-run cancel <id>``."""
        return subprocess.run(
            [PREFECT, "flow-run", "cancel", run_id], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
        )


_SERVICE: Prefect | None = None


def service() -> Prefect:
    """The campaign process's server and Runner, started on first use, stopped at exit."""
    global _SERVICE
    if _SERVICE is None:
        home = Path(tempfile.mkdtemp(prefix="soak-prefect-", dir=TMP_ROOT))
        (home / "tmp").mkdir(mode=0o700)
        svc = Prefect(home)

        def stop() -> None:
            svc.stop()
            shutil.rmtree(home, ignore_errors=True)

        closing.on_close(stop)
        svc.start()
        _SERVICE = svc
    return _SERVICE


def _wait_for(pred: Callable[[], Any], timeout: float, alive: Callable[[], bool] = lambda: True) -> Any:
    """``pred()`` once truthy, or None after ``timeout`` or once ``alive()`` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if not alive():
            return pred() or None
        time.sleep(0.05)
    return None


def _pid(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Run the soak flow once on the campaign's Prefect server with ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    t0 = time.monotonic()
    svc = service()
    timings = {"service": time.monotonic() - t0}
    retried = svc.retried
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, log_dir, tmp = (workdir / n for n in ("ckpt", "progress", "logs", "tmp"))
    for d in (ckpt, progress, tmp):
        d.mkdir(mode=0o700)
    notes: list[str] = []
    extra: dict[str, Any] = {}
    token = uuid.uuid4().hex
    env = {
        **runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S),
        "XDG_STATE_HOME": str(workdir / "state"),
        "TMPDIR": str(tmp),
    }
    pid_file, record_file = workdir / "flow-run.pid", workdir / "record.json"
    params = {
        "env": env,
        "log_dir": str(log_dir),
        "pid_file": str(pid_file),
        "record": str(record_file),
        "timeout": faults.timeout_of(run.fault),
        "grace_period": faults.GRACE_S,
        "replicas": faults.REPLICAS,
        "nproc": faults.NPROC,
    }
    started = time.monotonic()
    flow_run = svc.create_run(params)
    extra["flow_run"] = flow_run
    watcher = _wait_for(lambda: _pid(pid_file), START_S) or 0
    extra["watcher"] = watcher
    timings["process"] = time.monotonic() - started
    hung, injected = False, True
    if not watcher:
        hung = True
        notes.append(f"the Runner started no process for flow run {flow_run} within {START_S:g} s")
    elif faults.FAULTS[run.fault][0] is False and run.fault != "none":

        def cancel() -> None:
            t0 = time.monotonic()
            done = svc.cancel(flow_run, svc.env)
            extra["cancel_cli_s"] = time.monotonic() - t0
            notes.append(f"prefect flow-run cancel: rc {done.returncode} in {extra['cancel_cli_s']:.1f} s")

        injected = faults.inject_external(
            run.fault,
            run.rank,
            run.moment,
            alive=lambda: _alive(watcher),
            watcher=watcher,
            progress=progress,
            log_dir=log_dir,
            cancel=cancel,
        )
        if run.fault == "cancel" and injected:
            sent = time.monotonic()
            ended = _wait_for(lambda: not _alive(watcher), faults.GRACE_S + faults.CANCEL_MARGIN_S)
            extra["cancel_s"] = time.monotonic() - sent
            if ended:
                notes.append(f"cancel: the flow-run process ended {extra['cancel_s']:.1f} s after the CLI returned")
            else:
                hung = True
                notes.append(
                    f"cancel: the flow-run process still ran {faults.GRACE_S + faults.CANCEL_MARGIN_S:g} s "
                    "after the CLI returned"
                )
    if watcher and not hung:
        deadline = started + START_S + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S
        if not _wait_for(lambda: not _alive(watcher), max(1.0, deadline - time.monotonic())):
            hung = True
            notes.append("the flow-run process was still running at the deadline")
    if watcher and hung:
        for pid in [watcher, *faults.descendants(watcher)]:
            faults.kill(pid, signal.SIGKILL)
    duration = time.monotonic() - started
    timings["ended"] = duration
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    if watcher and _alive(watcher):
        leftovers.append(f"{watcher}: the flow-run process")
    # Prefect's view: the final states, then the logs (the Runner's exit line comes last)
    fr = _wait_for(lambda: (r := svc.flow_run(flow_run))["state"]["type"] in FINAL and r, SETTLE_S) or svc.flow_run(
        flow_run
    )
    logs = svc.logs(flow_run)  # the process ended: its log worker sent everything it had before it exited
    tasks = svc.task_runs(flow_run)
    extra["artifacts"] = [
        {"key": a.get("key"), "type": a.get("type"), "data": a.get("data")} for a in svc.artifacts(flow_run)
    ]
    timings["settled"] = time.monotonic() - started
    if svc.retried > retried:
        notes.append(f"the Prefect API answered 429/5xx or dropped {svc.retried - retried} request(s): retried")
    extra["timings"] = timings
    notes.append("timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items()))
    extra.update(
        flow_state=fr["state"]["type"],
        flow_message=fr["state"].get("message"),
        flow_run_count=fr.get("run_count"),
        tasks=[
            {
                "name": t["name"],
                "state": t["state"]["type"],
                "message": t["state"].get("message"),
                "run_count": t.get("run_count"),
            }
            for t in tasks
        ],
    )
    crashed = EXITED.search(str(fr["state"].get("message") or ""))
    process_rc = int(crashed[1]) if crashed else None
    extra["process_rc"] = process_rc
    task_ids = {t["id"] for t in tasks}
    console = "\n".join(x["message"] for x in logs if x.get("task_run_id") in task_ids)
    _write_private(workdir / "console.txt", console)
    record: dict[str, Any] = {}
    try:
        record = json.loads(record_file.read_text())
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as e:
        notes.append(f"the flow's record is unreadable: {e}")
    extra["record"] = record
    run_dir = next((p for p in sorted(log_dir.glob("soak-*")) if p.is_dir()), None) if log_dir.exists() else None
    result, source = None, "none"
    if run_dir and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    task_state = tasks[0]["state"]["type"] if len(tasks) == 1 else f"{len(tasks)} task runs"
    state = AS_STEP.get(task_state, task_state)
    rc = int(result["exit_code"]) if result and result.get("exit_code") is not None else process_rc
    killed = run.fault == "sigkill_watcher" and injected
    _write_private(
        workdir / "prefect.json", json.dumps({k: v for k, v in extra.items() if k != "record"}, indent=1, default=str)
    )
    return Observation(
        rc=rc if rc is not None else -1,
        duration_s=duration,
        result=result,
        result_source=source,
        console=console,
        run_dir=run_dir,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        state=state,
        watcher_killed=killed,
        agent_killed=run.fault == "sigkill_agent" and injected,
        extra=extra,
    )


#: The flow run's final state for each final state of its one task run.
FLOW_STATE = {"COMPLETED": "COMPLETED", "FAILED": "FAILED", "CANCELLED": "CANCELLED"}


def check(run: Run, obs: Observation) -> list[tuple[str, str]]:
    """This surface's own checks of what Prefect shows (invariants 1, 4 and 6).

    - one task run, and it and the flow run ran once (``run_count`` 1): the agents own the
      soak AppDef's retries, Prefect never adds a second layer;
    - the flow run's state agrees with the task run's (COMPLETED, FAILED, CANCELLED alike);
      after ``sigkill_watcher`` the flow run is CRASHED with the Runner's "exited with status
      code: -9" and the task run still RUNNING;
    - what the task returned (or its StepFailed's ``result``) is the step's ``result.json``;
      a Failed task run's message is the step's failure summary (app id, state, exit code).

    Args:
        run: the planned run.
        obs: what :func:`run` observed.

    Returns:
        ``(invariant key, detail)`` for each thing that does not hold.
    """
    bad: list[tuple[str, str]] = []
    x = obs.extra
    tasks = x.get("tasks") or []
    if obs.hung or not x.get("watcher"):
        return bad  # invariant 5 already says it; Prefect's view of a killed run proves nothing more
    if len(tasks) != 1:
        bad.append(("4", f"{len(tasks)} task runs, expected 1: {tasks}"))
    counts = [x.get("flow_run_count"), *(t.get("run_count") for t in tasks)]
    if any(c != 1 for c in counts):
        bad.append(("4", f"run counts (flow run, task runs) {counts}, expected 1 each: Prefect retried"))
    flow, task = x.get("flow_state"), tasks[0]["state"] if len(tasks) == 1 else None
    if run.fault == "sigkill_watcher" and obs.injected:
        if flow != "CRASHED" or x.get("process_rc") != -signal.SIGKILL:
            bad.append(("1", f"flow run {flow} (process exit {x.get('process_rc')}), expected CRASHED, exit -9"))
    elif task is not None and FLOW_STATE.get(task) != flow:
        bad.append(("1", f"task run {task} but flow run {flow} ({x.get('flow_message')})"))
    record = (x.get("record") or {}).get("result")
    if record is not None and obs.result is not None and record != obs.result:
        diff = sorted(k for k in set(record) | set(obs.result) if record.get(k) != obs.result.get(k))
        bad.append(("6", f"the task's result differs from result.json in {diff}"))
    bad += _check_artifacts(obs)
    if task == "FAILED" and obs.result is not None:
        head = f"{obs.result.get('app_id')} {obs.result.get('state')} (exit code {obs.result.get('exit_code')})"
        if head not in str(tasks[0].get("message")):
            bad.append(("6", f"the Failed task run's message does not say {head!r}: {tasks[0].get('message')!r}"))
    return bad


def _check_artifacts(obs: Observation) -> list[tuple[str, str]]:
    """The step's record as the Prefect UI shows it: a step that ended with a result
    (succeeded, failed, cancelled) has its ``soak-outputs`` markdown (app id, state, exit
    code, restarts) and its ``soak-ranks`` table (every rank's state and exit code), agreeing
    with ``result.json`` (invariant 6)."""
    res = obs.result
    if res is None or obs.watcher_killed:
        return []
    bad: list[tuple[str, str]] = []
    found = {a["key"]: a for a in obs.extra.get("artifacts") or []}
    outputs, ranks = found.get("soak-outputs"), found.get("soak-ranks")
    head = f"**{res.get('app_id')}**: {res.get('state')} (exit {res.get('exit_code')}, restarts {res.get('restarts')})"
    if outputs is None:
        bad.append(("6", f"no soak-outputs artifact of the {res.get('state')} step (artifacts: {sorted(found)})"))
    elif not str(outputs.get("data") or "").startswith(head):
        bad.append(("6", f"the soak-outputs artifact does not start with {head!r}: {str(outputs.get('data'))[:200]!r}"))
    want = sorted(
        (k.get("rank"), k.get("state"), k.get("exit_code"))
        for r in res.get("replicas") or []
        for k in r.get("ranks") or []
    )
    if ranks is None:
        bad.append(("6", f"no soak-ranks artifact of the {res.get('state')} step (artifacts: {sorted(found)})"))
    else:
        try:
            rows = json.loads(str(ranks.get("data")))
        except ValueError:
            rows = None
        got = sorted((r.get("rank"), r.get("state"), r.get("exit_code")) for r in rows or [])
        if got != want:
            bad.append(("6", f"the soak-ranks artifact says {got}, result.json {want}"))
    return bad
