"""torchstep.steps.signals: a deadline cancels a step; the first signal cancels, the second kills."""

from __future__ import annotations

import os
import signal
import threading

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
