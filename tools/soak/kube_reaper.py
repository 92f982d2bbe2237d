"""Stop a soak campaign's one-machine cluster once the campaign process is gone, whatever
ended it (the ``kubernetes`` surface starts one per campaign process and stops it at exit; a
process killed first, such as a pytest-xdist worker ended at the session's end, never runs
its exit handlers, and would leave the API server, its pods, dnsmasq and the network
namespaces behind).

Usage: ``python kube_reaper.py`` with ``tests/`` on ``PYTHONPATH``, started in its own session
before the cluster, its stdin a pipe from the campaign process, which writes JSON lines:
``{"prefix": P, "root": DIR, "home": DIR}``, then ``{"server": PID}`` once the API server runs,
and ``{"done": true}`` when it stopped the cluster itself. EOF without ``done`` means the
campaign process is gone (the pipe's only writer): SIGTERM to the server's session (it stops
its pods and removes its namespaces), SIGKILL 30 s later, then everything left with the
cluster's prefix removed (``cluster.kubelet.cleanup``: pod processes by their cgroups,
dnsmasq, namespaces, cgroups) and the campaign's cluster directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def reap(lines: list[str]) -> bool:
    """Stop what the campaign's lines describe, unless it said ``done``.

    Args:
        lines: the JSON lines the campaign wrote.

    Returns:
        Whether anything had to be stopped.
    """
    spec: dict[str, Any] = {}
    for line in lines:
        try:
            spec.update(json.loads(line))
        except ValueError:
            continue
    if spec.get("done") or "prefix" not in spec:
        return False
    server = int(spec.get("server") or 0)
    if server and _alive(server):
        try:
            os.killpg(server, signal.SIGTERM)  # its own session: start_server's start_new_session
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.5)
        try:
            os.killpg(server, signal.SIGKILL)
        except ProcessLookupError:
            pass
    from cluster.kubelet import cleanup  # tests/ on PYTHONPATH

    cleanup(str(spec["prefix"]), Path(spec["root"]))
    if spec.get("home"):
        shutil.rmtree(str(spec["home"]), ignore_errors=True)
    return True


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C to the campaign's terminal is the campaign's
    reap(list(sys.stdin))
