"""Process helpers shared by the test suites: polling, the /proc leak check, killing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``pred`` until it returns something truthy (generous deadlines: 2 shared cores)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def procs_with_env(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``marker`` (``NAME=value``),
    whatever session or parent they ended up in; this process excluded."""
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


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def proc_environ(pid: int) -> dict[str, str]:
    """A live process's environment (``{}`` once it is gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def proc_cmdline(pid: int) -> str:
    """A live process's command line, words joined by spaces (``""`` once it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def airflow_task_process(ti_id: str) -> int | None:
    """The pid of the process running Airflow task instance ``ti_id`` (a worker titles it
    ``airflow worker -- <id>``), or None."""
    want = f"airflow worker -- {ti_id}".encode()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == want:
                    return int(name)
        except OSError:
            continue
    return None
