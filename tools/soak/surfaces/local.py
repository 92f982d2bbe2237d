"""Surface ``local``: ``torchstep run --app soak.json`` (the local target), watched as a
subprocess in its own session; every process of the run carries ``SOAK_MARK=<token>``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tools.soak import component, faults, procs, runkit
from tools.soak.model import Observation, Run

NAME = "local"
FAULTS = tuple(faults.FAULTS)
#: Lines every rank prints and the pause after each (the job is short on purpose).
LINES, INTERVAL_S = 10, 0.15


def app_json() -> dict[str, Any]:
    """The soak AppDef (tools/soak/component.py) as ``torchstep run --app`` reads it."""
    from torchstep.local.appfile import app_to_dict

    return app_to_dict(component.soak(faults.REPLICAS, faults.NPROC))


def _printed_result(out: str) -> dict[str, Any] | None:
    at = out.rfind("\n{\n")
    if at < 0:
        return None
    try:
        return json.loads(out[at + 1 :])
    except ValueError:
        return None


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Run the soak job once through ``torchstep run`` with ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    expect = faults.FAULTS[run.fault][1]
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    app = workdir / "soak.json"
    app.write_text(json.dumps(app_json()))
    ckpt, progress, log_dir = workdir / "ckpt", workdir / "progress", workdir / "logs"
    ckpt.mkdir(mode=0o700)
    progress.mkdir(mode=0o700)
    notes: list[str] = []
    mounted = faults.log_disk(run.fault, log_dir, notes)
    token = uuid.uuid4().hex
    env = dict(os.environ, **runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S))
    cfg = f"timeout={faults.timeout_of(run.fault)},grace_period={faults.GRACE_S:g},retry_delay=0"
    argv = [
        sys.executable,
        "-m",
        "torchstep.cli",
        "run",
        "--app",
        str(app),
        "--log-dir",
        str(log_dir),
        "--retries",
        "0",
        "-c",
        cfg,
        "--json",
        "--no-live",
    ]
    console = workdir / "console.txt"
    started = time.monotonic()
    hung = False
    with open(console, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        injected = True
        try:
            if not faults.FAULTS[run.fault][0] and run.fault != "none":
                injected = faults.inject_external(
                    run.fault,
                    run.rank,
                    run.moment,
                    alive=lambda: proc.poll() is None,
                    watcher=proc.pid,
                    progress=progress,
                    log_dir=log_dir,
                    cancel=lambda: proc.send_signal(signal.SIGTERM),
                )
                sent = time.monotonic()
                if run.fault == "cancel" and injected:
                    try:
                        proc.wait(timeout=faults.GRACE_S + faults.CANCEL_MARGIN_S)
                    except subprocess.TimeoutExpired:
                        notes.append(
                            f"cancel: still running {faults.GRACE_S + faults.CANCEL_MARGIN_S:g} s after SIGTERM"
                        )
                        hung = True
                    else:
                        notes.append(f"cancel: ended {time.monotonic() - sent:.1f} s after SIGTERM")
            if not hung:
                proc.wait(
                    timeout=max(
                        1.0, faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S - (time.monotonic() - started)
                    )
                )
        except subprocess.TimeoutExpired:
            hung = True
        if hung:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    duration = time.monotonic() - started
    text = console.read_text(errors="replace")
    run_dir = next((p for p in sorted(log_dir.glob("soak-*")) if p.is_dir()), None) if log_dir.exists() else None
    result, source = None, "none"
    if run_dir and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    if result is None:
        result = _printed_result(text)
        source = "--json" if result is not None else "none"
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    if mounted:
        faults.umount(log_dir)
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    del expect, seed
    return Observation(
        rc=proc.returncode,
        duration_s=duration,
        result=result,
        result_source=source,
        console=text,
        run_dir=run_dir,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        expect_lines_in_files=run.fault != "logfull",
        watcher_killed=run.fault == "sigkill_watcher" and injected,
        agent_killed=run.fault == "sigkill_agent" and injected,
    )
