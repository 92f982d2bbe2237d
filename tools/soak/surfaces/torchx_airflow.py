"""Surface ``torchx_airflow``: ``torchx run -s airflow tools/soak/component.py:soak`` against a
real Airflow deployment (PostgreSQL, api-server, scheduler, dag-processor, LocalExecutor): the
``airflow_scheduler`` surface's, whose dags folder also holds the generic DAG (``python -m
torchstep_airflow.torchx_dag``), started once per campaign process for both.

The step runs in the Airflow task process of the generic DAG's one task (the agents' parent:
the process watching the step, which ``sigkill_watcher`` SIGKILLs); ``cancel`` is ``torchx
cancel`` (the DAG run marked failed: Airflow stops the task, its ``on_kill`` cancels the
step); the final state is what ``torchx status`` says once the DAG run has ended. The generic
DAG runs the step without the worker's environment (``inherit_env=False``): the ``SOAK_*``
variables travel in the AppDef (the component's ``--env``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tools.soak import component, faults, procs, runkit
from tools.soak.model import Observation, Run
from tools.soak.surfaces import airflow_scheduler

NAME = "torchx_airflow"
#: The classes an orchestrator changes (the rest test the agent alone: local, torchx).
FAULTS = ("none", "exit", "nonretryable", "sigkill_agent", "sigkill_watcher", "cancel", "flood")
LINES, INTERVAL_S = 10, 0.15
#: Uses a deployment: the smoke runs its runs on the worker of airflow_scheduler's (one start for both).
SERVER = True
GROUP = airflow_scheduler.GROUP
ROOT = Path(__file__).resolve().parents[3]
TORCHX = str(Path(sys.executable).with_name("torchx"))

EXPECT = {
    "sigkill_watcher": dataclasses.replace(
        faults.FAULTS["sigkill_watcher"][1],
        state="FAILED",
        exit_code=None,
        guarantee=(
            "the Airflow task process is SIGKILLed: Airflow fails the task (the generic DAG has no "
            "Airflow retries), `torchx status` says FAILED, the agents and workers die with it, no process left"
        ),
    ),
    "cancel": dataclasses.replace(
        faults.FAULTS["cancel"][1],
        exit_code=None,
        guarantee=(
            "`torchx cancel` (the DAG run marked failed): Airflow stops the task, its `on_kill` cancels the "
            "step: CANCELLED in the result and in `torchx status`, nothing left running"
        ),
    ),
}


def watcher_of(rank_pid: int) -> int:
    """The process that started the agent above ``rank_pid`` (the Airflow task process); 0 if
    none. A worker forked by the agent's zygote carries the agent's command line too: the
    watcher is the first ancestor above the outermost one that does."""
    pid, seen_agent = rank_pid, False
    while pid > 1:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            return 0
        agent = b"torchstep.agent" in argv[:4] or any(a.endswith(b"torchstep-agent") for a in argv[:2])
        if seen_agent and not agent:
            return pid
        seen_agent = seen_agent or agent
        pid = faults.parent_of(pid)
    return 0


_FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _status(text: str) -> str | None:
    m = re.search(r"^\s*State:\s*(\S+)", text, re.M)
    return m[1] if m else None


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Submit the soak job with ``torchx run -s airflow`` under ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    d = airflow_scheduler.deployment()
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, state_dir = (workdir / n for n in ("ckpt", "progress", "state"))
    for p in (ckpt, progress, state_dir):
        p.mkdir(mode=0o700)
    notes: list[str] = []
    token = uuid.uuid4().hex
    job_env = runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["XDG_STATE_HOME"] = str(state_dir)

    def torchx(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TORCHX, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)

    started = time.monotonic()
    sub = torchx(
        "run",
        "-s",
        "airflow",
        "-cfg",
        f"endpoint={d.url}",
        f"{component.__file__}:soak",
        "--job",
        component.JOB,
        "--env",
        ",".join(f"{k}={v}" for k, v in job_env.items()),
    )
    handle = next((ln for ln in sub.stdout.splitlines() if ln.startswith("airflow://")), "")
    if not handle:
        notes.append(f"torchx run failed ({sub.returncode}): {sub.stderr[-800:]}")
        return Observation(
            rc=sub.returncode,
            duration_s=time.monotonic() - started,
            result=None,
            result_source="none",
            console=sub.stdout + sub.stderr,
            run_dir=None,
            leftovers=procs.leftovers(f"SOAK_MARK={token}"),
            notes=notes,
        )
    watcher = 0

    def state() -> str | None:
        return _status(torchx("status", handle, timeout=60).stdout)

    def running() -> bool:
        nonlocal watcher
        if not watcher:
            seen = faults.progress_of(progress, run.rank)
            if seen:
                watcher = watcher_of(seen[0])
        return state() not in _FINAL

    def watching() -> bool:  # cheap: polled every 20 ms while a fault waits for its line
        return bool(watcher) and faults.parent_of(watcher) != 0

    injected, hung = True, False
    limit = started + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S
    if not faults.FAULTS[run.fault][0] and run.fault != "none":
        # the task process is known once a rank reported its first line (files only: fast)
        checked = 0.0
        while not faults.progress_of(progress, run.rank) and time.monotonic() < limit:
            if time.monotonic() - checked > 5:
                checked = time.monotonic()
                if not running():
                    break
            time.sleep(0.02)
        running()
        injected = faults.inject_external(
            run.fault,
            run.rank,
            run.moment,
            alive=watching,
            watcher=watcher,
            progress=progress,
            log_dir=workdir / "no-log-disk",
            cancel=lambda: notes.append(f"torchx cancel: rc {torchx('cancel', handle).returncode}"),
        )
    if run.fault == "cancel" and injected:
        limit = time.monotonic() + faults.GRACE_S + faults.CANCEL_MARGIN_S
    while running():
        if time.monotonic() > limit:
            hung = True
            notes.append("the DAG run had not ended at the deadline")
            if watcher:
                faults.kill(watcher, signal.SIGKILL)
            break
        time.sleep(1.0)
    # the DAG run ends first (a cancel marks it failed at once): the step's result is written
    # by the task process as it stops, so wait for that process too
    while watching() and not hung and time.monotonic() < limit:
        time.sleep(0.1)
    duration = time.monotonic() - started
    final = state()
    console = torchx("log", f"{handle}/soak", timeout=120).stdout
    at = re.search(r"torchstep: (soak-[0-9a-z]+): logs and result under (\S+)", console)
    run_dir = Path(at[2]) if at else None
    result, source = None, "none"
    if run_dir is not None and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    if watcher:  # the task process carries no mark: it must be gone as well
        deadline = time.monotonic() + 15
        while faults.parent_of(watcher) and time.monotonic() < deadline:
            time.sleep(0.1)
        if faults.parent_of(watcher):
            leftovers.append(f"{watcher}: the Airflow task process")
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    rc = int(result["exit_code"]) if result and result.get("exit_code") is not None else -1
    return Observation(
        rc=rc,
        duration_s=duration,
        result=result,
        result_source=source,
        console=console,
        run_dir=run_dir if run_dir is not None and run_dir.exists() else None,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        state=final,
        watcher_killed=run.fault == "sigkill_watcher" and injected,
        agent_killed=run.fault == "sigkill_agent" and injected,
        extra={"handle": handle},
    )
