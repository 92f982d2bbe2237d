"""The ``/proc`` leftover scan of the soak: live processes whose environment holds a marker
(the soak's own; the test suites keep theirs in ``tests/proclib.py``: tools and tests never
import each other)."""

from __future__ import annotations

import os
import signal
import time


def procs_with_env(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``marker`` (``NAME=value``),
    whatever session or parent they ended up in; this process excluded.

    Args:
        marker: ``NAME=value``.

    Returns:
        Their pids.
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
        except (OSError, IndexError):  # gone, not ours, or a stat line cut short
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


def leftovers(marker: str, within: float = 15.0) -> list[str]:
    """Wait up to ``within`` seconds for every process carrying ``marker`` to end; SIGKILL
    and describe those still alive (invariant 2).

    Args:
        marker: ``NAME=value``.
        within: the grace the run's processes get after its end.

    Returns:
        ``pid: command line`` of each process that was still alive.
    """
    deadline = time.monotonic() + within
    while (left := procs_with_env(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    text = describe(left)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return text
