"""The fault classes: what each injects, and the outcome torchstep must give under it (the
one table of expected final states, also printed into docs/reliability.md).

A fault is either *in-worker* (the job injures itself, driven by ``SOAK_FAULT*`` env vars,
see job.py) or *external* (the harness acts on a process or the disk at a line number).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Replicas (agents) x processes per replica of the soak job.
REPLICAS, NPROC = 2, 2
WORLD = REPLICAS * NPROC
#: Seconds ``cancel`` gives the run before SIGKILL (cfg grace_period) and the margin allowed.
GRACE_S, CANCEL_MARGIN_S = 3.0, 12.0
#: The run's own timeout (cfg timeout), generous: 2 shared cores may run 4 campaigns at once.
RUN_TIMEOUT_S = 150
#: ... except under ``stop``, where it is what ends a rank stopped without a timer.
STOP_TIMEOUT_S = 35
#: The harness's deadline for a run, past its timeout: past it the run counts as a hang (invariant 5).
DEADLINE_MARGIN_S = 45


#: The variable ``python -m tools.soak --hang-timeout S`` sets: every agent of the campaign then
#: runs with ``--hang-timeout S`` (``TORCHSTEP_HANG_TIMEOUT`` in the job's environment).
HANG_ENV = "SOAK_HANG_TIMEOUT"


def hang_timeout_s() -> float | None:
    """The agents' ``--hang-timeout`` in this campaign (``SOAK_HANG_TIMEOUT``), or None: off."""
    value = os.environ.get(HANG_ENV, "")
    return float(value) if value else None


def timeout_of(fault: str) -> int:
    """The run's own ``timeout`` (cfg) under ``fault``. Under ``stop`` with ``--hang-timeout``
    the run's timeout is the usual one: the hang stop is what ends the stopped rank."""
    return STOP_TIMEOUT_S if fault == "stop" and hang_timeout_s() is None else RUN_TIMEOUT_S


def hang_stops(result: dict | None, console: str = "") -> int:
    """How many times the agents of a run stopped a group for ``--hang-timeout``: the replicas
    whose ranks (reason ``hang_timeout``) or restart history (their message) say so in the
    step result, or, where the console holds the agents' own lines, their "where the ranks
    were (no progress for ..." lines, whichever counts more."""
    in_result = 0
    if isinstance(result, dict):
        for rep in result.get("replicas") or []:
            if not isinstance(rep, dict):
                continue
            ranks = [r for r in rep.get("ranks") or [] if isinstance(r, dict)]
            if any(r.get("reason") == "hang_timeout" for r in ranks) or "hang_timeout" in str(rep.get("message")):
                in_result += 1
    in_console = console.count("where the ranks were (no progress for ")
    return max(in_result, in_console)


@dataclass(frozen=True)
class Expect:
    """The outcome a fault class must give on the local target.

    Attributes:
        state: the final state (None: no final state is required).
        exit_code: the exit status of ``torchstep run`` (None: not checked).
        restarts: agent restarts summed over replicas (each agent restarting its workers once
            counts one; a replaced agent counts one); None: not compared, but no worker group
            may have been started twice (no ``attempt_1`` directory).
        restarts_max: the most restarts allowed when several counts are right: the agent of the
            faulty rank counts its restart; a peer agent counts one when its own workers failed
            first, none when it saw the new rendezvous round first (a membership change).
        attempts: ``torchstep run`` tries (``--retries 0``: always 1).
        names_rank: the root cause must name the faulty rank.
        guarantee: the sentence docs/reliability.md prints for the class.
        record: a result record is required (result.json or the ``--json`` print).
    """

    state: str | None
    exit_code: int | None
    restarts: int | None
    attempts: int = 1
    names_rank: bool = False
    guarantee: str = ""
    record: bool = True
    restarts_max: int | None = None
    message_has: str | None = None

    def restarts_ok(self, counted: object) -> bool:
        """Whether ``counted`` restarts are what this class allows."""
        if self.restarts is None:
            return True
        if not isinstance(counted, int):
            return False
        return self.restarts <= counted <= (self.restarts_max if self.restarts_max is not None else self.restarts)

    @property
    def restarts_text(self) -> str:
        """The expected restarts as the report prints them."""
        if self.restarts is None:
            return "no worker restarted"
        if self.restarts_max is not None and self.restarts_max != self.restarts:
            return f"{self.restarts}-{self.restarts_max}"
        return str(self.restarts)


#: fault class -> (in_worker, expected outcome on the local target)
FAULTS: dict[str, tuple[bool, Expect]] = {
    "none": (False, Expect("SUCCEEDED", 0, 0, guarantee="no fault: every line once, exit 0, no restart")),
    "exit": (
        True,
        Expect(
            "SUCCEEDED",
            0,
            1,
            restarts_max=REPLICAS,
            guarantee=(
                "a rank exits non-zero once: the agents restart the group once (the faulty rank's agent counts "
                "it; a peer counts it too when its own workers failed before it saw the new rendezvous round), "
                "it resumes after the checkpoint and SUCCEEDS; no orchestrator retry"
            ),
        ),
    ),
    "sigkill_rank": (
        False,
        Expect(
            "SUCCEEDED",
            0,
            1,
            restarts_max=REPLICAS,
            guarantee=("a rank is SIGKILLed: as a non-zero exit (group restart from the budget, SUCCEEDED)"),
        ),
    ),
    "stop_timer": (
        True,
        Expect(
            "SUCCEEDED",
            0,
            1,
            restarts_max=REPLICAS,
            guarantee=(
                "a rank SIGSTOPs inside `torchstep.expires(after=2)`: the agent's timer kills it, the "
                "group restarts once and SUCCEEDS"
            ),
        ),
    ),
    "stop": (
        True,
        Expect(
            "FAILED",
            124,
            0,
            guarantee=(
                "a rank SIGSTOPs with no timer: nothing inside the job can tell a stopped rank from a slow "
                "one; the run's `timeout` ends it: FAILED, exit 124, every process killed, never a hang"
            ),
        ),
    ),
    "sigkill_agent": (
        False,
        Expect(
            "SUCCEEDED",
            0,
            1,
            restarts_max=REPLICAS,
            guarantee=(
                "an agent is SIGKILLed (a lost node): a new agent replaces it from the same budget, the "
                "group re-forms and SUCCEEDS; its workers are killed, never orphaned"
            ),
        ),
    ),
    "sigkill_watcher": (
        False,
        Expect(
            None,
            -signal.SIGKILL,
            0,
            guarantee=(
                "`torchstep run` itself is SIGKILLed: no process of the run survives it (death signal, "
                "launch-token scan); no final result can be written by a dead process"
            ),
            record=False,
        ),
    ),
    "cancel": (
        False,
        Expect(
            "CANCELLED",
            128 + signal.SIGTERM,
            0,
            guarantee=(
                "SIGTERM to `torchstep run`: CANCELLED, exit 143, within grace_period + a margin, nothing left running"
            ),
        ),
    ),
    "logfull": (
        False,
        Expect(
            "SUCCEEDED",
            0,
            0,
            guarantee=(
                "the log filesystem fills mid-run: the step's outcome is unchanged (SUCCEEDED), the "
                "console keeps every line, `warnings` name the truncated files"
            ),
        ),
    ),
    "flood": (
        True,
        Expect(
            "SUCCEEDED",
            0,
            1,
            restarts_max=REPLICAS,
            guarantee=("a rank writes 20 MiB then exits 3: logged, group restarted once, SUCCEEDED"),
        ),
    ),
    "daemon": (
        True,
        Expect(
            "SUCCEEDED",
            0,
            0,
            guarantee=(
                "a rank leaves a double-forked `setsid` daemon: the run SUCCEEDS and the daemon is killed at the end"
            ),
        ),
    ),
    "rdzv_stall": (
        False,
        Expect(
            "FAILED",
            83,
            0,
            message_has="the rendezvous store does not answer",
            guarantee=(
                "the rendezvous store stops answering for good (its process SIGSTOPped: connections are "
                "accepted, nothing is answered, as behind a proxy that stops forwarding): the workers "
                "finish their lines (gloo does not need the store), the agents' next store call blocks, "
                "the agent's watchdog ends the run: FAILED, exit 83, retryable, the message names the "
                "store call that hung, the ranks that finished show SUCCEEDED; never a hang"
            ),
        ),
    ),
    "nonretryable": (
        True,
        Expect(
            "FAILED",
            82,
            None,
            names_rank=True,
            guarantee=(
                "a rank raises `torchstep.NonRetryableError`: FAILED, exit 82, `retryable: false`, no worker "
                "restarted nor the step retried, root cause names the rank (a peer agent whose own workers "
                "failed first may count a restart it never ran: see 'Found on the way')"
            ),
        ),
    ),
}

#: Seconds of the agents' no-progress watchdog under ``rdzv_stall`` (default 60): what ends
#: a run whose store went silent, shortened so that the campaign does not wait a minute.
STALL_WATCHDOG_S = 20


#: The most seconds a rank waits at an external fault's line for the harness (``hold_env``).
HOLD_MAX_S = 30


def hold_env(fault: str, rank: int, line: int) -> dict[str, str]:
    """The job's environment that makes an external fault's rank wait at its line until the
    harness has acted (``release``): on 2 loaded cores a harness that only polls could see
    the line after the run had ended, and the fault never struck.

    Args:
        fault: a key of FAULTS.
        rank: the global rank whose progress times the fault.
        line: the line after which it waits.

    Returns:
        ``SOAK_HOLD_RANK`` / ``SOAK_HOLD_LINE`` / ``SOAK_HOLD_MAX_S``, or nothing (an in-worker fault, none).
    """
    if fault == "none" or FAULTS[fault][0]:
        return {}
    return {"SOAK_HOLD_RANK": str(rank), "SOAK_HOLD_LINE": str(line), "SOAK_HOLD_MAX_S": str(HOLD_MAX_S)}


def release(progress: Path) -> None:
    """Let the rank that waits at the fault's line go on (the fault is injected, or never will be)."""
    with contextlib.suppress(OSError):
        os.close(os.open(progress / "go", os.O_CREAT | os.O_WRONLY, 0o600))


def in_worker_env(fault: str, rank: int, line: int) -> dict[str, str]:
    """The job's environment for an in-worker fault (empty for an external one).

    Args:
        fault: a key of FAULTS.
        rank: the global rank that injures itself.
        line: the line number before which it does.

    Returns:
        The ``SOAK_FAULT*`` variables.
    """
    if not FAULTS[fault][0]:
        return {}
    return {"SOAK_FAULT": fault, "SOAK_FAULT_RANK": str(rank), "SOAK_FAULT_LINE": str(line)}


def tail_env(fault: str) -> dict[str, str]:
    """The run's environment a fault class needs beside the job's: under ``cancel`` the job
    stays alive after its last line, so that a cancel through an orchestrator's CLI (seconds
    to start) always finds the step running; under ``rdzv_stall`` the agents' watchdog is
    shorter (``TORCHSTEP_WATCHDOG_TIMEOUT``); with ``--hang-timeout`` every agent gets it
    (``TORCHSTEP_HANG_TIMEOUT``).

    Args:
        fault: a key of FAULTS.

    Returns:
        ``SOAK_TAIL_S`` / ``TORCHSTEP_WATCHDOG_TIMEOUT`` / ``TORCHSTEP_HANG_TIMEOUT``, or nothing.
    """
    hang = hang_timeout_s()
    env = {"TORCHSTEP_HANG_TIMEOUT": f"{hang:g}"} if hang is not None else {}
    if fault == "cancel":
        env["SOAK_TAIL_S"] = "60"
    if fault == "rdzv_stall":
        env["TORCHSTEP_WATCHDOG_TIMEOUT"] = str(STALL_WATCHDOG_S)
    return env


def progress_of(progress: Path, rank: int) -> tuple[int, int] | None:
    """``(pid, line)`` rank ``rank`` last reported, or None before its first line."""
    try:
        pid, line = (progress / f"rank{rank}").read_text().split()
        return int(pid), int(line)
    except (OSError, ValueError):
        return None


def parent_of(pid: int) -> int:
    """The parent pid from /proc (0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def agent_of(worker: int, launcher: int) -> int:
    """The agent above ``worker``: its ancestor whose parent is the launcher (``torchstep run``)."""
    pid = worker
    while pid > 1:
        up = parent_of(pid)
        if up == launcher:
            return pid
        pid = up
    return 0


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc, breadth first)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            children.setdefault(parent_of(int(name)), []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def store_of(watcher: int) -> int:
    """The rendezvous store process below ``watcher`` (``python -m torchstep.local.store``); 0 if none."""
    for pid in descendants(watcher):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"torchstep.local.store" in argv:
            return pid
    return 0


def kill(pid: int, sig: int) -> bool:
    """Send ``sig``; False when the process is already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def log_disk(fault: str, log_dir: Path, notes: list[str]) -> bool:
    """Fill the log disk for the ``logfull`` fault (a small tmpfs on ``log_dir``); whether it
    was mounted (to unmount at the end). Where it cannot be, ``notes`` says so.

    Args:
        fault: the run's fault class.
        log_dir: the run's log directory.
        notes: the run's report notes.

    Returns:
        True when a tmpfs was mounted on ``log_dir``.
    """
    if fault != "logfull":
        return False
    why = mount_tmpfs(log_dir)
    if why:
        notes.append(f"logfull: no tmpfs ({why}); the disk was not filled")
    return why is None


def mount_tmpfs(path: Path, size: str = "256k") -> str | None:
    """Mount a small private tmpfs on ``path``; the reason on failure (not root, no CAP_SYS_ADMIN)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], capture_output=True, text=True
    )
    return None if done.returncode == 0 else done.stderr.strip() or "mount failed"


def umount(path: Path) -> None:
    """Unmount ``path`` (lazily when still busy)."""
    if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> None:
    """Write a filler file into ``path`` until its filesystem is full (ENOSPC)."""
    with open(path / ".filler", "wb", buffering=0) as f:
        block = b"\0" * 4096
        try:
            while True:
                f.write(block)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def inject_external(
    fault: str,
    rank: int,
    moment: int,
    *,
    alive: Callable[[], bool],
    watcher: int,
    progress: Path,
    log_dir: Path,
    cancel: Callable[[], None],
) -> bool:
    """Wait until rank ``rank`` printed line ``moment``, then inject the external ``fault``.

    Args:
        fault: sigkill_rank, sigkill_agent, sigkill_watcher, cancel, logfull or rdzv_stall.
        rank: the faulty rank (whose progress times the fault).
        moment: the line number.
        alive: whether the run still runs.
        watcher: the pid of the process watching the step (the agents' parent).
        progress: the job's progress directory.
        log_dir: the run's log directory (a tmpfs under ``logfull``).
        cancel: cancels the step through the orchestrator.

    Returns:
        Whether it was injected (False: the run ended first).
    """
    try:
        return _inject(
            fault, rank, moment, alive=alive, watcher=watcher, progress=progress, log_dir=log_dir, cancel=cancel
        )
    finally:
        release(progress)


def _inject(
    fault: str,
    rank: int,
    moment: int,
    *,
    alive: Callable[[], bool],
    watcher: int,
    progress: Path,
    log_dir: Path,
    cancel: Callable[[], None],
) -> bool:
    while alive():
        seen = progress_of(progress, rank)
        if seen and seen[1] >= moment:
            pid = seen[0]
            if fault == "sigkill_rank":
                return kill(pid, signal.SIGKILL)
            if fault == "sigkill_agent":
                agent = agent_of(pid, watcher)
                return bool(agent) and kill(agent, signal.SIGKILL)
            if fault == "sigkill_watcher":
                return kill(watcher, signal.SIGKILL)
            if fault == "rdzv_stall":
                store = store_of(watcher)
                return bool(store) and kill(store, signal.SIGSTOP)
            if fault == "cancel":
                cancel()
                return True
            if fault == "logfull":
                if not os.path.ismount(log_dir):  # never fill a real disk: no tmpfs, no fault
                    return False
                fill(log_dir)
            return True
        time.sleep(0.02)
    return False
