"""Processes that escape: a worker's double-forked, setsid'ed daemon with an empty
environment never outlives the run — after success, failure, SIGTERM or SIGKILL of the
top process (the agent is a child subreaper; adopted processes are registered with its
reaper and killed at the end)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from proclib import wait_for

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "daemonizer.py")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def daemon_pid(pidfile: Path) -> int:
    wait_for(pidfile.exists, 120, "the worker's daemon to start")
    pid = int(pidfile.read_text())
    assert alive(pid)
    return pid


def assert_gone(pid: int) -> None:
    try:
        wait_for(lambda: not alive(pid), 15, f"the daemon {pid} to be killed")
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["ok", "fail"])
def test_a_daemon_does_not_outlive_a_finished_run(tmp_path: Path, mode: str) -> None:
    pidfile = tmp_path / "daemon.pid"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchstep.agent",
            "--nproc-per-node",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
            SCRIPT,
            str(pidfile),
            mode,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == (0 if mode == "ok" else 1), done.stderr[-2000:]
    assert_gone(int(pidfile.read_text()))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_daemon_does_not_outlive_a_signalled_agent(tmp_path: Path, sig: signal.Signals) -> None:
    pidfile = tmp_path / "daemon.pid"
    signal_top_process(
        [
            sys.executable,
            "-m",
            "torchstep.agent",
            "--nproc-per-node",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
            SCRIPT,
            str(pidfile),
            "hang",
        ],
        pidfile,
        tmp_path / "logs",
        sig,
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_daemon_does_not_outlive_torchstep_run(tmp_path: Path, sig: signal.Signals) -> None:
    pidfile = tmp_path / "daemon.pid"
    app = {
        "name": "daemons",
        "roles": [{"name": "w", "image": "x", "entrypoint": "python", "args": [SCRIPT, str(pidfile), "hang"]}],
    }
    (tmp_path / "app.json").write_text(json.dumps(app))
    signal_top_process(
        [
            sys.executable,
            "-m",
            "torchstep.cli",
            "run",
            "--app",
            str(tmp_path / "app.json"),
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        pidfile,
        tmp_path / "logs",
        sig,
    )


def signal_top_process(argv: list[str], pidfile: Path, logs: Path, sig: signal.Signals) -> None:
    """Start ``argv``, wait until its worker's daemon runs and the agent adopted it, send
    ``sig`` to the top process: the daemon must be gone within seconds."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = daemon_pid(pidfile)
        wait_for(
            lambda: any("adopted" in p.read_text() for p in logs.rglob("agent.log")),
            10,
            "the sweeper to adopt the daemon",
        )
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert_gone(pid)
    finally:
        proc.kill()
        proc.wait()
