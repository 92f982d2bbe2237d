"""Surface ``airflow``: the soak job as an Airflow 3 task (tools/soak/airflow_dag.py: one
``AppDefOperator``, local target), run with ``dag.test()`` by tools/soak/airflow_driver.py,
one driver process per run in its own session, all sharing one migrated SQLite
``AIRFLOW_HOME`` per campaign process (created on first use in a private temporary
directory, removed at exit).

``dag.test()`` runs the task in its own process (Airflow's in-process test supervisor): the
driver is the process watching the step (the agents' parent). Its stdout is the console
(the task log, every rank's lines prefixed ``[soak/R]``); the final state is the task
instance's (from the driver's summary, or from the metadata DB when the driver was killed);
the result record is the step's ``result.json`` (``cfg log_dir`` = the DAG run's
``params.log_dir``), and the task's XCom ``return_value`` must agree with it (:func:`check`).
Airflow's ``retries`` is 0 (the soak role's REPLICA budget belongs to the agents): the task
instance must end with ``max_tries`` 0 and ``try_number`` 1 under every fault.

How the external faults are injected:

- ``sigkill_watcher``: the driver is SIGKILLed (the task's process dies, as a worker whose
  node is lost). The agents see their parent die and stop every process of the step; no step
  result can be written by the dead process. With ``dag.test()`` no scheduler is left to
  notice: the task instance stays ``running`` in the DB (a real scheduler would fail it as a
  zombie task); the campaign checks that nothing was retried and nothing is left.
- ``cancel``: without a scheduler there is no REST API to mark the task failed. The most real
  cancel is what Airflow itself does when a task is marked failed or cleared, or its DAG run
  is failed (``torchx cancel -s airflow``): the task runner's supervisor sends **SIGTERM to
  the process running the task** (``airflow.sdk.execution_time.supervisor``
  ``ActivitySubprocess.kill``); the task runner's SIGTERM handler (``task_runner._on_term``)
  calls the operator's ``on_kill``. Under ``dag.test()`` the task runs in the driver, whose
  handler is that same one: SIGTERM goes to the driver alone. ``on_kill`` cancels the step
  (every agent SIGTERMed, SIGKILL after ``grace_period``); the try fails with the result
  CANCELLED (exit 143) in XCom and ``result.json``. Airflow has no cancelled state: the task
  ends ``failed``, which this surface reports as CANCELLED because it sent the cancel, as
  ``torchx status -s airflow`` does for a run ``torchx cancel`` failed. The driver must end
  within ``GRACE_S + CANCEL_MARGIN_S`` of the signal.
- ``sigkill_agent``: an agent (the driver's child) SIGKILLed: replaced from the agents' budget.

In-worker faults (``exit``, ``nonretryable``, ``flood``) reach the workers through the
driver's environment: the local target's step inherits the environment of the process that
runs the task (``cfg inherit_env`` is true by default), as do the ``SOAK_*`` variables and the
``SOAK_MARK`` the /proc scan looks for (the driver carries it too: it must be gone as well).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from tools.soak import closing, faults, procs, runkit
from tools.soak.model import Observation, Run

NAME = "airflow"
#: The classes an orchestrator changes (the rest test the agent alone: local, torchx).
FAULTS = ("none", "exit", "nonretryable", "sigkill_agent", "sigkill_watcher", "cancel", "flood")
LINES, INTERVAL_S = 10, 0.15
#: One migrated AIRFLOW_HOME per campaign process: the smoke runs all of this surface's runs
#: in one test worker (one ``airflow db migrate``, not one per worker).
SERVER = True
SOAK = Path(__file__).resolve().parent.parent
ROOT = SOAK.parent.parent
DAG_FILE, DRIVER = SOAK / "airflow_dag.py", SOAK / "airflow_driver.py"
DAG_ID, TASK_ID = "torchstep_soak", "soak"
BIN = Path(sys.executable).parent
#: Seconds ``dag.test()`` may take to start the task (imports, the DAG's serialization, the
#: in-process execution API) on 2 shared cores, on top of the run's own timeout.
START_S = 120.0
#: Where the first home is made: fixed at import (the smoke gives each run its own TMPDIR and
#: removes it after the run; the home outlives runs).
_BASE = tempfile.gettempdir()
#: The Airflow task state a fault class must end in (``sigkill_watcher``: nobody is left to
#: change it under ``dag.test()``; a scheduler would fail the zombie task).
TASK_STATE = {
    "none": "success",
    "exit": "success",
    "sigkill_agent": "success",
    "flood": "success",
    "nonretryable": "failed",
    "cancel": "failed",
    "sigkill_watcher": "running",
}
#: Airflow task state -> the step state it means (Airflow has no cancelled state).
STATES = {"success": "SUCCEEDED", "failed": "FAILED", "up_for_retry": "FAILED", "upstream_failed": "FAILED"}

_home: Path | None = None


def _remove(home: Path) -> None:
    procs.leftovers(f"AIRFLOW_HOME={home}", within=0)
    shutil.rmtree(home.parent, ignore_errors=True)


def env_of(home: Path, **extra: str) -> dict[str, str]:
    """The environment of an Airflow process of the campaign (as tests/airflow/conftest.py's
    ``airflow_env``): its own home and DAG folder, no examples, the venv's scripts and the
    repository (the DAG file imports ``tools.soak``) on the paths.

    Args:
        home: the AIRFLOW_HOME.
        extra: more variables (the run's ``SOAK_*``).

    Returns:
        The environment.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p),
        }
    )
    env.update(extra)
    return env


def home() -> Path:
    """The campaign process's migrated AIRFLOW_HOME (made on first use, removed at exit).

    Returns:
        The home (its ``dags`` folder links the soak DAG file).

    Raises:
        RuntimeError: ``airflow db migrate`` failed.
    """
    global _home
    if _home is not None and (_home / "airflow.db").exists():
        return _home
    root = Path(tempfile.mkdtemp(prefix="torchstep-airflow-soak-", dir=_BASE))  # 0700
    made = root / "home"
    (made / "dags").mkdir(mode=0o700, parents=True)
    (made / "dags" / DAG_FILE.name).symlink_to(DAG_FILE)
    closing.on_close(_remove, made)
    done = subprocess.run(
        [str(BIN / "airflow"), "db", "migrate"], env=env_of(made), capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        raise RuntimeError(f"airflow db migrate exited {done.returncode}: {done.stderr[-2000:]}")
    _home = made
    return made


def _summary(text: str) -> dict[str, Any] | None:
    from tools.soak.airflow_driver import SUMMARY

    lines = [ln for ln in text.splitlines() if ln.startswith(SUMMARY)]
    return json.loads(lines[-1][len(SUMMARY) :]) if lines else None


def _from_db(where: Path, conf_log_dir: str) -> dict[str, Any] | None:
    """The DAG run of this soak run (its conf names ``conf_log_dir``) as the metadata DB has
    it, for a driver that printed no summary (it was killed)."""
    with sqlite3.connect(f"file:{where / 'airflow.db'}?mode=ro", uri=True, timeout=30) as db:
        found = None
        for run_id, state, conf in db.execute("SELECT run_id, state, conf FROM dag_run WHERE dag_id = ?", (DAG_ID,)):
            if conf_log_dir in str(conf):
                found = (run_id, state)
        if found is None:
            return None
        tasks = {
            task: {"state": st, "try_number": tries, "max_tries": most, "xcom": None}
            for task, st, tries, most in db.execute(
                "SELECT task_id, state, try_number, max_tries FROM task_instance WHERE dag_id = ? AND run_id = ?",
                (DAG_ID, found[0]),
            )
        }
    return {"state": found[1], "run_id": found[0], "tasks": tasks, "source": "db"}


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Run the soak DAG once with ``dag.test()`` under ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    where = home()
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, log_dir = workdir / "ckpt", workdir / "progress", workdir / "logs"
    for d in (ckpt, progress):
        d.mkdir(mode=0o700)
    notes: list[str] = []
    token = uuid.uuid4().hex
    env = env_of(where, **runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S))
    argv = [
        sys.executable,
        str(DRIVER),
        str(where / "dags" / DAG_FILE.name),
        DAG_ID,
        json.dumps({"log_dir": str(log_dir)}),
    ]
    console = workdir / "console.txt"
    started = time.monotonic()
    hung, injected, cancelled = False, True, False
    with open(console, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
        )

        def cancel() -> None:
            nonlocal cancelled
            cancelled = faults.kill(proc.pid, signal.SIGTERM)

        limit = started + START_S + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S
        try:
            if not faults.FAULTS[run.fault][0] and run.fault != "none":
                injected = faults.inject_external(
                    run.fault,
                    run.rank,
                    run.moment,
                    alive=lambda: proc.poll() is None,
                    watcher=proc.pid,
                    progress=progress,
                    log_dir=workdir / "no-log-disk",
                    cancel=cancel,
                )
                sent = time.monotonic()
                if run.fault == "cancel" and injected:
                    limit = sent + faults.GRACE_S + faults.CANCEL_MARGIN_S
                    try:
                        proc.wait(timeout=limit - time.monotonic())
                        notes.append(f"cancel: the task's process ended {time.monotonic() - sent:.1f} s after SIGTERM")
                    except subprocess.TimeoutExpired:
                        notes.append(f"cancel: the task's process still ran {limit - sent:g} s after SIGTERM")
                        raise
            proc.wait(timeout=max(1.0, limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    duration = time.monotonic() - started
    text = console.read_text(errors="replace")
    summary = _summary(text)
    if summary is None:
        summary = _from_db(where, str(log_dir))
    task = ((summary or {}).get("tasks") or {}).get(TASK_ID)
    run_dir = next((p for p in sorted(log_dir.glob("soak-*")) if p.is_dir()), None) if log_dir.exists() else None
    result, source = None, "none"
    if run_dir is not None and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    if result is None and task and task.get("xcom"):
        result, source = task["xcom"], "XCom return_value"
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    ti_state = (task or {}).get("state")
    state = STATES.get(ti_state or "")
    if state == "FAILED" and cancelled:  # Airflow has no cancelled state: the try we stopped failed
        state = "CANCELLED"
    if proc.returncode < 0 or result is None:
        rc = proc.returncode
    else:
        rc = int(result.get("exit_code") if result.get("exit_code") is not None else -1)
    if proc.returncode > 0:
        notes.append(f"the dag.test driver exited {proc.returncode}: {text[-600:]}")
    return Observation(
        rc=rc,
        duration_s=duration,
        result=result,
        result_source=source,
        console=text,
        run_dir=run_dir,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        state=state,
        watcher_killed=run.fault == "sigkill_watcher" and injected,
        agent_killed=run.fault == "sigkill_agent" and injected,
        extra={"summary": summary, "task": task, "driver_rc": proc.returncode},
    )


def check(run: Run, obs: Observation) -> list[tuple[str, str]]:
    """Airflow's side of invariants 1, 4 and 6: the task instance's state is the fault
    class's, Airflow never retried (``max_tries`` 0, ``try_number`` 1: the REPLICA budget is
    the agents'), and the task's XCom ``return_value`` agrees with ``result.json``.

    Args:
        run: the planned run.
        obs: what :func:`run` observed.

    Returns:
        ``(invariant, detail)`` of each thing that does not hold.
    """
    fault = run.fault if obs.injected else "none"
    task = obs.extra.get("task")
    if obs.hung:
        return []  # invariant 5 says it
    if not task:
        return [("1", f"Airflow has no task instance of the run ({obs.extra.get('summary')})")]
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
    if fault != "sigkill_watcher" and obs.result is not None and xcom is None:
        bad.append(("6", "the task pushed no XCom return_value"))
    return bad
