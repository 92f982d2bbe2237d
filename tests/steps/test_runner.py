"""torchstep.steps.runner: the work runs in a helper thread; what interrupts the caller's wait
stops the work first, then propagates."""

from __future__ import annotations

import threading

import pytest
from torchstep.result import StepResult
from torchstep.steps.runner import CancellableRunner


class Sleeper(CancellableRunner):
    """A step whose work waits until it is cancelled, then returns CANCELLED."""

    def __init__(self, try_number: int = 1) -> None:
        super().__init__("test-sleeper", 1.0, None, try_number)
        self.started = threading.Event()

    def run(self) -> StepResult:
        def work() -> StepResult:
            self.started.set()
            self._cancel.wait(60)
            return StepResult("sleeper", "CANCELLED" if self._cancel.is_set() else "SUCCEEDED", None)

        return self._run(work)


def test_the_result_counts_the_try_given_at_construction() -> None:
    step = Sleeper(try_number=3)
    step.cancel()
    result = step.run()
    assert result.state == "CANCELLED" and result.attempts == 3 and step.result is result


def test_an_interrupt_of_the_wait_cancels_the_work_and_waits_for_it_before_propagating() -> None:
    step = Sleeper()

    def interrupt_once_started() -> None:
        step.started.wait(30)
        threading.Event().wait(1.0)  # the caller's thread is in its wait loop by then
        import _thread

        _thread.interrupt_main()  # what Ctrl-C, or Airflow's timeout alarm, does to the waiting thread

    threading.Thread(target=interrupt_once_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        step.run()
    assert step.result is not None and step.result.state == "CANCELLED"  # stopped before the interrupt went on


def test_an_error_of_the_work_reaches_the_caller() -> None:
    class Broken(CancellableRunner):
        def run(self) -> StepResult:
            def work() -> StepResult:
                raise RuntimeError("cluster unreachable")

            return self._run(work)

    with pytest.raises(RuntimeError, match="cluster unreachable"):
        Broken("broken", 1.0, None).run()


def test_say_writes_a_torchstep_note_and_survives_a_failing_logger() -> None:
    lines: list[str] = []
    CancellableRunner("n", 1.0, lines.append).say("attaching")
    assert lines == ["torchstep: attaching"]

    def broken(text: str) -> None:
        raise OSError("log sink gone")

    CancellableRunner("n", 1.0, broken).say("still runs")  # no exception
