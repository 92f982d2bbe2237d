"""Stops from outside a step: a deadline (:func:`run_with_deadline`) and termination
signals (:func:`stop_on_signals`)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING

from torchstep.childproc import STOPPING

if TYPE_CHECKING:
    from torchstep.result import StepResult
    from torchstep.steps.kubernetes import KubernetesStep
    from torchstep.steps.local import LocalStep

__all__ = ["run_with_deadline", "stop_on_signals"]


def run_with_deadline(step: LocalStep | KubernetesStep, seconds: float | None) -> tuple[StepResult, bool]:
    """``step.run()``, the step cancelled (every process of it stopped) once ``seconds`` have
    passed: for an orchestrator whose own timeout cannot interrupt blocking code (Prefect's
    ``timeout_seconds`` in a worker thread raises only once the call returns).

    Args:
        step: the opened step (:func:`~torchstep.steps.open_step`).
        seconds: the time it may run (``None`` or ``0``: no deadline here).

    Returns:
        The step result and whether the deadline passed (the step was cancelled).
    """
    expired = threading.Event()
    timer = None
    if seconds:

        def expire() -> None:
            expired.set()
            step.cancel()

        timer = threading.Timer(float(seconds), expire)
        timer.daemon = True
        timer.start()
    try:
        result = step.run()
    finally:
        if timer is not None:
            timer.cancel()
    return result, expired.is_set()


@contextlib.contextmanager
def stop_on_signals(
    cancel: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
) -> Iterator[list[int]]:
    """While inside, the first of ``signals`` sets ``cancel`` (:func:`~torchstep.steps.run_tries`
    stops the step within its grace period) and a second raises ``KeyboardInterrupt`` (the
    step is killed at once); the previous handlers come back on the way out. In a thread
    other than the main one it installs nothing (the caller's own handlers decide).

    Args:
        cancel: the event the first signal sets.
        signals: the signals handled.

    Yields:
        The list of signals received so far (it grows while inside).

    Example::

        cancel = threading.Event()
        with stop_on_signals(cancel) as received:
            result = run_tries(plan, attempt=None, cancel=cancel)
    """
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt  # a second signal: no more grace
        STOPPING.set()  # the ancestors watch adds no signal of its own to this one
        cancel.set()

    try:
        previous = {s: signal.signal(s, on_signal) for s in signals}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
