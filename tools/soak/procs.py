"""The ``/proc`` leftover scan: live processes whose environment holds a marker (the scan
itself is the test suites' ``tests/proclib.py``: one implementation for both)."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parents[2] / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)

from proclib import procs_with_env  # noqa: E402


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
