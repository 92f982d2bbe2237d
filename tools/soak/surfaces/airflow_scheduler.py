"""Surface ``airflow_scheduler``: the soak job as an Airflow 3 task in a real deployment
(PostgreSQL + api-server + scheduler + dag-processor with the LocalExecutor: the
``Deployment`` of tests/airflow/conftest.py, started once per campaign process and stopped
at exit, or by tools/soak/airflow_reaper.py when the process is killed first), the DAG
tools/soak/airflow_scheduler_dag.py triggered through the REST API.

The task runs in the process the executor's task supervisor forks (``airflow worker --
<ti id>``): the process watching the step (the agents' parent). The run's ``SOAK_*``
variables travel in the DAG run's conf into the role's env (that process does not inherit
the harness's environment), so the agents and workers carry ``SOAK_MARK`` and the task
process does not: it is checked apart (it must be gone within 15 s as well). The final state
is the task instance's (REST), the console its task log (REST, ``full_content``), the result
record the step's ``result.json`` (``cfg log_dir`` from the conf); XCom ``return_value``
must agree with it, and Airflow must never have tried twice (``retries`` 0: the agents own
the REPLICA budget).

How the external faults are injected:

- ``cancel``: the task instance is marked **failed through the REST API** (``PATCH
  .../taskInstances/soak`` ``{"new_state": "failed"}``, what the UI's "Mark failed" does).
  The supervisor's next heartbeat is refused (409) and it sends SIGTERM to the task process
  (SIGKILL 5 s later); the task runner's handler calls ``on_kill``, which cancels the step.
  Airflow keeps the user's ``failed``; this surface reports it as CANCELLED because it sent
  the cancel (as ``torchx status -s airflow`` does). The step's ``result.json`` must say
  CANCELLED, exit 143, and the task process must end within a heartbeat interval
  (``[workers] min_heartbeat_interval``, 5 s) + ``GRACE_S + CANCEL_MARGIN_S`` of the request.
- ``sigkill_watcher``: the task process is SIGKILLed: the supervisor reports the try failed
  (Airflow: ``failed``, no retry), the agents see their parent die and stop every process.
- ``sigkill_agent``: an agent (the task process's child) SIGKILLed: replaced from the budget.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from tools.soak import closing, faults, procs, runkit
from tools.soak.model import Observation, Run
from tools.soak.surfaces import airflow as _dagtest

NAME = "airflow_scheduler"
FAULTS = _dagtest.FAULTS
LINES, INTERVAL_S = 10, 0.15
#: Starts a deployment: the smoke runs all of this surface's runs in one test worker.
SERVER = True
SOAK = Path(__file__).resolve().parent.parent
ROOT = SOAK.parent.parent
DAG_FILE = SOAK / "airflow_scheduler_dag.py"
DAG_ID, TASK_ID = "torchstep_soak_scheduler", "soak"
#: The generic DAG of ``torchx run -s airflow``, in the same deployment (surface torchx_airflow).
TORCHX_DAG_ID = "torchstep_torchx"
#: The smoke's xdist group: both surfaces of the one deployment run on one worker.
GROUP = "soak-airflow-deployment"
#: Seconds between the supervisor's heartbeats (``[workers] min_heartbeat_interval``): a
#: task marked failed hears of it at the next one.
HEARTBEAT_S = 5.0
#: Seconds the scheduler may take from the trigger to a running task (2 shared cores).
START_S = 120.0
STATES = _dagtest.STATES
TASK_STATE = dict(_dagtest.TASK_STATE, sigkill_watcher="failed")

#: Where this surface's outcome differs from the local target's (faults.FAULTS).
EXPECT = {
    "sigkill_watcher": dataclasses.replace(
        faults.FAULTS["sigkill_watcher"][1],
        state="FAILED",
        exit_code=None,
        guarantee=(
            "the task process (`airflow worker -- <ti>`) is SIGKILLed: its supervisor fails the try (no retry), "
            "the agents see their parent die and stop every process; no result can be written by the dead process"
        ),
    ),
    "cancel": dataclasses.replace(
        faults.FAULTS["cancel"][1],
        guarantee=(
            "the task instance marked failed through the REST API: the supervisor SIGTERMs the task process at its "
            "next heartbeat, `on_kill` cancels the step: CANCELLED, exit 143, nothing left running"
        ),
    ),
}

#: The temporary directory when this module was imported (see :func:`deployment`).
_BASE = tempfile.gettempdir()
_deployment: Any = None


def _conftest() -> Any:
    """tests/airflow/conftest.py as a module (its Deployment: one implementation for both)."""
    tests = str(ROOT / "tests")
    if tests not in sys.path:
        sys.path.append(tests)
    before = {k: os.environ.get(k) for k in ("AIRFLOW_HOME", "AIRFLOW__CORE__LOAD_EXAMPLES")}
    spec = importlib.util.spec_from_file_location("soak_airflow_conftest", ROOT / "tests" / "airflow" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for k, v in before.items():  # its in-process defaults are for pytest's process, not the campaign's
        if v is None:
            os.environ.pop(k, None)
    return module


def _stop(d: Any) -> None:
    try:
        d.stop()
    finally:
        shutil.rmtree(d.home, ignore_errors=True)


def deployment() -> Any:
    """The campaign process's Airflow deployment (started on first use, stopped at exit).

    Returns:
        The tests' ``Deployment``, its dags folder holding only the soak DAG, the DAG known.

    Raises:
        RuntimeError: PostgreSQL is not installed.
    """
    global _deployment
    if _deployment is not None:
        return _deployment
    conftest = _conftest()
    if conftest.postgres_bin() is None:
        raise RuntimeError("PostgreSQL is not installed (make system-deps installs it)")
    d = conftest.Deployment()
    for link in (d.home / "dags").iterdir():  # the tests' DAGs: not parsed every 30 s here
        link.unlink()
    (d.home / "dags" / DAG_FILE.name).symlink_to(DAG_FILE)
    # the generic DAG of `torchx run -s airflow` too (surface torchx_airflow): one deployment for both
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_airflow.torchx_dag", str(d.home / "dags")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if out.returncode:
        raise RuntimeError(f"python -m torchstep_airflow.torchx_dag failed: {out.stderr[-2000:]}")
    # the components outlive the run that started them: not that run's TMPDIR (the smoke
    # gives each run its own and removes it after the run)
    tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = _BASE
    reaper = _reaper(d)
    started = threading.Event()
    threading.Thread(target=_tell, args=(d, reaper, started), daemon=True).start()
    try:
        d.start()
        d.wait(lambda: _known(d) and _known(d, TORCHX_DAG_ID), 180, f"the dag-processor to register {DAG_ID}")
    except BaseException:
        _stop(d)
        raise
    finally:
        started.set()
        if tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = tmpdir
    closing.on_close(_stop, d)
    _deployment = d
    return d


def _reaper(d: Any) -> subprocess.Popen[str]:
    """Start tools/soak/airflow_reaper.py: it stops the deployment once this process is gone
    without having stopped it (killed: its exit handlers never ran). Its stdin is a pipe
    from this process alone: EOF tells it this process is gone."""
    spec = {
        "home": str(d.home),
        "pg_stop": [*d.pg.as_user, str(d.pg.bin / "pg_ctl"), "-D", str(d.pg.dir), "-m", "fast", "-w", "stop"],
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SOAK_"))}
    return subprocess.Popen(
        [sys.executable, str(SOAK / "airflow_reaper.py"), json.dumps(spec)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _tell(d: Any, reaper: subprocess.Popen[str], started: threading.Event) -> None:
    """Write each component's process group to the reaper as soon as it runs."""
    told: set[int] = set()
    while True:
        done = started.is_set()
        for proc in list(d.procs.values()):
            if proc.pid not in told and reaper.stdin is not None:
                reaper.stdin.write(f"{proc.pid}\n")
                reaper.stdin.flush()
                told.add(proc.pid)
        if done:
            return
        time.sleep(0.05)


def _known(d: Any, dag_id: str = DAG_ID) -> bool:
    try:
        return bool(d.call("GET", f"/api/v2/dags/{dag_id}", ok=()))
    except AssertionError:
        return False


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def task_process_of(rank_pid: int) -> int:
    """The task process above a rank: the ancestor the task runner named ``airflow worker --
    <ti id>`` (setproctitle), the parent of its agent (a worker's own parent is the agent's
    zygote, a fork of the agent with the agent's command line).

    Args:
        rank_pid: a worker's pid.

    Returns:
        The pid, or 0 when not found.
    """
    pid = faults.parent_of(rank_pid)
    while pid > 1:
        if b" ".join(_cmdline(pid)).startswith(b"airflow worker"):
            return pid
        pid = faults.parent_of(pid)
    return 0


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie its supervisor has not reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _console(d: Any, path: str) -> str:
    """The task log of try 1, one line per event (as the UI shows it)."""
    got = d.call("GET", f"{path}/taskInstances/{TASK_ID}/logs/1?full_content=true")
    lines = []
    for item in got.get("content") or []:
        if isinstance(item, dict):
            lines.append(str(item.get("event", "")))
        else:
            lines.append(str(item))
    return "\n".join(lines)


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Trigger the soak DAG once on the deployment under ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    d = deployment()
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, log_dir = workdir / "ckpt", workdir / "progress", workdir / "logs"
    for p in (ckpt, progress):
        p.mkdir(mode=0o700)
    notes: list[str] = []
    token = uuid.uuid4().hex
    job_env = runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S)
    started = time.monotonic()
    conf = {"log_dir": str(log_dir), "env": json.dumps(job_env)}
    dag_run = d.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": conf})
    path = f"/api/v2/dags/{DAG_ID}/dagRuns/{urllib.parse.quote(dag_run['dag_run_id'], safe='')}"
    task_path = f"{path}/taskInstances/{TASK_ID}"
    watcher = 0

    def ti() -> dict[str, Any]:
        try:
            return dict(d.call("GET", task_path))
        except (AssertionError, OSError):
            return {}

    def running() -> bool:
        nonlocal watcher
        if not watcher:
            seen = faults.progress_of(progress, run.rank)
            if seen:
                watcher = task_process_of(seen[0])
        return d.call("GET", path).get("state") not in ("success", "failed")

    cancelled, injected, hung = False, True, False

    def cancel() -> None:
        nonlocal cancelled
        d.call("PATCH", task_path, {"new_state": "failed"})
        cancelled = True

    limit = started + START_S + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S
    if not faults.FAULTS[run.fault][0] and run.fault != "none":
        d.wait(
            lambda: faults.progress_of(progress, run.rank) or not running(), limit - time.monotonic(), "the first line"
        )
        running()
        injected = faults.inject_external(
            run.fault,
            run.rank,
            run.moment,
            alive=running,
            watcher=watcher,
            progress=progress,
            log_dir=workdir / "no-log-disk",
            cancel=cancel,
        )
        if run.fault == "cancel" and injected:
            sent = time.monotonic()
            limit = sent + HEARTBEAT_S + faults.GRACE_S + faults.CANCEL_MARGIN_S
            while watcher and _alive(watcher) and time.monotonic() < limit:
                time.sleep(0.1)
            if watcher and _alive(watcher):
                notes.append(f"cancel: the task process still ran {limit - sent:g} s after the REST call")
                hung = True
            else:
                notes.append(f"cancel: the task process ended {time.monotonic() - sent:.1f} s after the REST call")
    while not hung and running():
        if time.monotonic() > limit:
            hung = True
            notes.append(f"the DAG run was still {d.call('GET', path).get('state')} at the deadline")
            break
        time.sleep(0.5)
    if hung and watcher:
        faults.kill(watcher, signal.SIGKILL)
    duration = time.monotonic() - started
    task = ti()
    deadline = time.monotonic() + 30  # the DAG run ends a moment after its task: the task's state is final
    while task.get("state") not in ("success", "failed", "up_for_retry") and time.monotonic() < deadline and not hung:
        time.sleep(0.5)
        task = ti()
    try:
        xcom: Any = d.call("GET", f"{task_path}/xcomEntries/return_value", ok=(404,)).get("value")
    except (AssertionError, OSError) as e:
        xcom = None
        notes.append(f"XCom unreadable: {e}")
    if isinstance(xcom, str):
        try:
            xcom = json.loads(xcom)
        except ValueError:
            pass
    run_dir = next((p for p in sorted(log_dir.glob("soak-*")) if p.is_dir()), None) if log_dir.exists() else None
    result, source = None, "none"
    if run_dir is not None and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    if result is None and isinstance(xcom, dict):
        result, source = xcom, "XCom return_value"
    try:
        console = _console(d, path)
    except (AssertionError, OSError) as e:
        console = ""
        notes.append(f"task log unreadable: {e}")
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    if watcher:  # the task process carries no mark: it must be gone as well
        end = time.monotonic() + 15
        while _alive(watcher) and b"airflow worker" in b" ".join(_cmdline(watcher)) and time.monotonic() < end:
            time.sleep(0.1)
        if _alive(watcher) and b"airflow worker" in b" ".join(_cmdline(watcher)):
            leftovers.append(f"{watcher}: the task process")
            faults.kill(watcher, signal.SIGKILL)
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    state = STATES.get(task.get("state") or "")
    if state == "FAILED" and cancelled:  # Airflow has no cancelled state: the try we stopped failed
        state = "CANCELLED"
    rc = int(result["exit_code"]) if result and result.get("exit_code") is not None else -1
    task_summary = {
        "state": task.get("state"),
        "try_number": task.get("try_number"),
        "max_tries": task.get("max_tries"),
        "xcom": xcom if isinstance(xcom, dict) else None,
    }
    return Observation(
        rc=rc,
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
        watcher_killed=run.fault == "sigkill_watcher" and injected,
        agent_killed=run.fault == "sigkill_agent" and injected,
        extra={"task": task_summary, "dag_run_id": dag_run["dag_run_id"]},
    )


def check(run: Run, obs: Observation) -> list[tuple[str, str]]:
    """As the ``airflow`` surface's :func:`~tools.soak.surfaces.airflow.check`, with the
    scheduler's state after ``sigkill_watcher`` (``failed``: the supervisor saw its task die).

    Args:
        run: the planned run.
        obs: what :func:`run` observed.

    Returns:
        ``(invariant, detail)`` of each thing that does not hold.
    """
    fault = run.fault if obs.injected else "none"
    task = obs.extra.get("task") or {}
    if obs.hung:
        return []
    bad = []
    if task.get("state") != TASK_STATE[fault]:
        bad.append(("1", f"the Airflow task ended {task.get('state')}, expected {TASK_STATE[fault]}"))
    if task.get("max_tries") != 0 or task.get("try_number") != 1:
        bad.append(
            (
                "4",
                f"Airflow try {task.get('try_number')} of max_tries {task.get('max_tries')}, "
                "expected 1 of 0 (the agents own the REPLICA budget)",
            )
        )
    xcom, res = task.get("xcom"), obs.result
    if obs.result_source == "result.json" and xcom is not None and res is not None:
        keys = ("app_id", "state", "exit_code", "restarts", "retryable")
        if any(xcom.get(k) != res.get(k) for k in keys):
            bad.append(
                (
                    "6",
                    "XCom return_value and result.json differ: "
                    f"{[xcom.get(k) for k in keys]} vs {[res.get(k) for k in keys]}",
                )
            )
    if fault not in ("sigkill_watcher", "cancel") and obs.result is not None and xcom is None:
        bad.append(("6", "the task pushed no XCom return_value"))
    return bad
