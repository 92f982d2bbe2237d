"""A real ``prefect server start`` for a test: started in its own session on a loopback port,
awaited until its API answers, stopped with its whole process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from proclib import wait_for

PREFECT = str(Path(sys.executable).with_name("prefect"))


def start_server(env: dict[str, str], port: int, log: Path, timeout_s: float = 180) -> subprocess.Popen[bytes]:
    """``prefect server start`` on 127.0.0.1:``port`` with ``env`` (its PREFECT_HOME and
    database), its output in ``log``; returns once ``/api/health`` answers. A server that exits
    fails the wait at once with its log's tail (and is never left running)."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def healthy() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(healthy, timeout_s, "the Prefect server to start", interval=0.5)
    except BaseException:
        stop_server(proc)
        raise
    return proc


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
