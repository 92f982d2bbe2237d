"""The ``/proc`` leftover scan: live processes whose environment holds a marker."""

from __future__ import annotations

import os


def procs_with_env(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``marker`` (``NAME=value``).

    Args:
        marker: ``NAME=value`` exactly as in the environment.

    Returns:
        Their pids, this process excluded.
    """
    want = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{name}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if want in env and state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def describe(pids: list[int]) -> list[str]:
    """``pid: command line`` of each process still there."""
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid}: {cmd[:160]}")
        except OSError:
            pass
    return lines
