"""torchstep.steps.signals: a deadline cancels a step; the first signal cancels, the second kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from torchstep.result import StepResult
from torchstep.steps.signals import run_with_deadline, stop_on_signals


class WaitsForCancel:
    """A step that runs until cancelled (what run_with_deadline needs of one)."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def run(self) -> StepResult:
        state = "CANCELLED" if self.cancelled.wait(60) else "SUCCEEDED"
        return StepResult("s", state, None)

    def cancel(self) -> None:
        self.cancelled.set()


def test_run_with_deadline_cancels_the_step_once_the_time_is_up() -> None:
    result, expired = run_with_deadline(WaitsForCancel(), 0.2)  # type: ignore[arg-type]
    assert expired and result.state == "CANCELLED"


def test_run_with_no_deadline_leaves_the_step_alone() -> None:
    step = WaitsForCancel()
    threading.Timer(0.2, step.cancel).start()
    result, expired = run_with_deadline(step, None)  # type: ignore[arg-type]
    assert not expired and result.state == "CANCELLED"


def test_the_first_signal_sets_cancel_the_second_raises_and_the_old_handlers_return() -> None:
    if threading.current_thread() is not threading.main_thread():  # a runner's worker thread: a signal would kill it
        pytest.skip("signal handlers can only be installed from the main thread")
    before = signal.getsignal(signal.SIGUSR1)
    cancel = threading.Event()
    with pytest.raises(KeyboardInterrupt):
        with stop_on_signals(cancel, (signal.SIGUSR1,)) as received:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert cancel.wait(10) and received == [signal.SIGUSR1]
            os.kill(os.getpid(), signal.SIGUSR1)
            threading.Event().wait(10)  # the handler raises here
    assert signal.getsignal(signal.SIGUSR1) == before


def test_outside_the_main_thread_nothing_is_installed() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    seen: list[object] = []

    def inside() -> None:
        with stop_on_signals(threading.Event(), (signal.SIGUSR2,)) as received:
            seen.append(signal.getsignal(signal.SIGUSR2))
            seen.append(received)

    t = threading.Thread(target=inside)
    t.start()
    t.join(10)
    assert seen == [before, []]


# -- a Ctrl-C that also ends the runner (kfp.local: driver -> sh -> the step's process) ---------
STEP = """
import signal, sys, threading, time
from torchstep.childproc import stop_when_ancestors_die
from torchstep.steps.signals import stop_on_signals

stop_when_ancestors_die(poll_s=0.05)
cancel = threading.Event()
received = []
try:
    with stop_on_signals(cancel, (signal.SIGTERM, signal.SIGINT)) as received:
        print("ready", flush=True)
        cancel.wait(60)
        time.sleep(3)  # the step's processes stopping within their grace period
        print("graceful", received, flush=True)
except KeyboardInterrupt:
    print("killed at once", received, flush=True)
"""
RUNNER = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=open(sys.argv[2], "w"))
time.sleep(120)
"""


def _step_under_a_runner(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp_path / "step.out"
    runner = subprocess.Popen([sys.executable, "-c", RUNNER, STEP, str(out)], start_new_session=True)
    deadline = time.monotonic() + 60
    while "ready" not in (out.read_text() if out.exists() else ""):
        assert time.monotonic() < deadline, "the step never started"
        time.sleep(0.05)
    return runner, out


def _last_line(out: Path) -> str:
    deadline = time.monotonic() + 60
    while len(lines := out.read_text().splitlines()) < 2:
        assert time.monotonic() < deadline, out.read_text()
        time.sleep(0.1)
    return lines[-1]


def test_a_ctrl_c_that_also_ends_the_runner_stops_the_step_gracefully(tmp_path: Path) -> None:
    """Ctrl-C reaches the runner and the step together; the runner's end must not add a second
    signal (the ancestors watch's own SIGTERM), which kills every process at once: exit 137
    instead of 143 (a soak failure under load, kfp:cancel)."""
    runner, out = _step_under_a_runner(tmp_path)
    os.killpg(runner.pid, signal.SIGINT)
    runner.wait(30)
    assert _last_line(out) == f"graceful [{int(signal.SIGINT)}]"


def test_a_runner_killed_alone_still_stops_the_step(tmp_path: Path) -> None:
    runner, out = _step_under_a_runner(tmp_path)
    runner.kill()  # SIGKILL: no signal reaches the step; its watch stops it
    runner.wait(30)
    assert _last_line(out) == f"graceful [{int(signal.SIGTERM)}]"
