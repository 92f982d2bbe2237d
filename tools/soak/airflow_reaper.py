"""Stop a soak campaign's Airflow deployment once the campaign process is gone, whatever
ended it (the ``airflow_scheduler`` surface starts one per campaign process and stops it at
exit; a process killed first, such as a pytest-xdist worker ended at the session's end, never
runs its exit handlers, and would leave PostgreSQL and the scheduler running).

Usage: ``python airflow_reaper.py SPEC_JSON`` with ``{"home": dir, "pg_stop": argv}``,
started in its own session before the deployment, its stdin a pipe from the campaign
process, which writes each component's process group id on a line as it starts it. EOF
means the campaign process is gone (the pipe's only writer); then, unless the campaign
stopped the deployment itself (the home removed): SIGTERM to each component's process
group, SIGKILL 20 s later, every process still carrying ``AIRFLOW_HOME=<home>`` killed,
``pg_stop`` run, the home removed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _marked(marker: bytes) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def reap(spec: dict[str, Any]) -> None:
    """Read process groups until EOF, then stop what is left of the deployment.

    Args:
        spec: ``home`` and ``pg_stop`` (see the module docstring).
    """
    home = str(spec["home"])
    groups = [int(line) for line in sys.stdin if line.strip().isdigit()]
    if not os.path.isdir(home):
        return  # the campaign stopped it
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 20
    while any(_alive_group(g) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in _marked(f"AIRFLOW_HOME={home}".encode()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if os.path.exists(os.path.join(home, "pgdata", "postmaster.pid")):
        subprocess.run([str(a) for a in spec["pg_stop"]], capture_output=True, timeout=60)
    shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    reap(json.loads(sys.argv[1]))
