"""Surface ``torchx``: ``torchx run -s torchstep_local tools/soak/component.py:soak`` — the
app runs detached under the scheduler's supervisor (the process watching the step), is
cancelled with ``torchx cancel`` and its final state is what ``torchx status`` says."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tools.soak import component, faults, procs, runkit
from tools.soak.model import Observation, Run

NAME = "torchx"
FAULTS = tuple(faults.FAULTS)
LINES, INTERVAL_S = 10, 0.15
TORCHX = str(Path(sys.executable).with_name("torchx"))

#: Where this surface's outcome differs from the local target's (faults.FAULTS).
EXPECT = {
    "sigkill_watcher": dataclasses.replace(
        faults.FAULTS["sigkill_watcher"][1],
        state="FAILED",
        exit_code=None,
        guarantee="the supervisor is SIGKILLed: `torchx status` says FAILED (ended without a result), no process left",
    ),
}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _state(text: str) -> str | None:
    for line in text.splitlines():
        if line.strip().startswith("State:"):
            return line.split(":", 1)[1].strip()
    return None


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Submit the soak job with ``torchx run -s torchstep_local`` under ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, log_dir, state_dir = (workdir / n for n in ("ckpt", "progress", "logs", "state"))
    for d in (ckpt, progress, state_dir):
        d.mkdir(mode=0o700)
    notes: list[str] = []
    mounted = faults.log_disk(run.fault, log_dir, notes)
    token = uuid.uuid4().hex
    env = dict(
        os.environ, **runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S), XDG_STATE_HOME=str(state_dir)
    )

    def torchx(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([TORCHX, *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)

    cfg = f"log_dir={log_dir},timeout={faults.timeout_of(run.fault)},grace_period={faults.GRACE_S:g},retry_delay=0"
    started = time.monotonic()
    sub = torchx("run", "-s", "torchstep_local", "-cfg", cfg, f"{component.__file__}:soak", "--job", component.JOB)
    handle = next((ln for ln in sub.stdout.splitlines() if ln.startswith("torchstep_local://")), "")
    if not handle:
        notes.append(f"torchx run failed ({sub.returncode}): {sub.stderr[-500:]}")
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
    app_id = handle.rsplit("/", 1)[1]
    records = state_dir / "torchstep" / "torchx" / "torchstep_local"
    supervisor = int(json.loads((records / f"{app_id}.json").read_text())["pid"])
    injected, hung = True, False
    if not faults.FAULTS[run.fault][0] and run.fault != "none":
        injected = faults.inject_external(
            run.fault,
            run.rank,
            run.moment,
            alive=lambda: _alive(supervisor),
            watcher=supervisor,
            progress=progress,
            log_dir=log_dir,
            cancel=lambda: notes.append(f"torchx cancel: rc {torchx('cancel', handle).returncode}"),
        )
    limit = started + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S
    if run.fault == "cancel" and injected:
        limit = time.monotonic() + faults.GRACE_S + faults.CANCEL_MARGIN_S
    while _alive(supervisor):
        if time.monotonic() > limit:
            hung = True
            notes.append("the supervisor was still running at the deadline")
            os.killpg(supervisor, signal.SIGKILL)
            break
        time.sleep(0.1)
    duration = time.monotonic() - started
    status = torchx("status", handle)
    state = _state(status.stdout)
    run_dir = log_dir / app_id
    result, source = None, "none"
    try:
        result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
    except FileNotFoundError:
        kept = json.loads((records / f"{app_id}.status").read_text()).get("result")
        if kept:
            result, source = kept, "status record"
    except (OSError, ValueError) as e:
        notes.append(f"result.json unreadable: {e}")
    console_file = records / f"{app_id}.console"
    console = console_file.read_text(errors="replace") if console_file.exists() else ""
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    if mounted:
        faults.umount(log_dir)
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    rc = int(result["exit_code"]) if result and result.get("exit_code") is not None else -1
    return Observation(
        rc=rc,
        duration_s=duration,
        result=result,
        result_source=source,
        console=console,
        run_dir=run_dir if run_dir.exists() else None,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        expect_lines_in_files=run.fault != "logfull",
        state=state,
        watcher_killed=run.fault == "sigkill_watcher" and injected,
        agent_killed=run.fault == "sigkill_agent" and injected,
    )
