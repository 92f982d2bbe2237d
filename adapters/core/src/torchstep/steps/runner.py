"""The cancellable runner under both step kinds: the work runs in a helper thread while the
caller's thread waits in slices, so whatever interrupts that wait (a timeout alarm, a
termination signal, an injected cancellation) stops every process of the step before it
propagates; ``cancel()`` works from any thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchstep.result import StepResult

__all__ = ["CANCEL_MARGIN_S", "POLL_S", "CancellableRunner", "LineCallback", "say"]

#: Seconds to wait, after a cancel, beyond the run's own grace period (the launcher sends
#: SIGTERM, waits the grace period, then SIGKILLs and reaps everything).
CANCEL_MARGIN_S = 30.0
#: The caller's thread waits in slices this long: an exception injected into it (Prefect's
#: timeouts and cancellations, Airflow's alarm) lands within one slice.
POLL_S = 0.2

LineCallback = Callable[[str], None]
log = logging.getLogger("torchstep.steps")


def say(on_line: LineCallback | None, text: str) -> None:
    """A note of torchstep's (``torchstep: <text>``) to ``on_line``, else printed.

    Args:
        on_line: where the step's lines go; ``None``: stdout.
        text: the note, one line.
    """
    try:
        (on_line or print)(f"torchstep: {text}")
    except Exception:  # a logger that fails must not stop the run
        pass


class CancellableRunner:
    """Runs a step's work in a helper thread; the base of both step kinds.

    Args:
        name: the helper thread's name.
        grace_s: the step's grace period: after a cancel, how long its processes may take to
            stop (the wait is this plus :data:`CANCEL_MARGIN_S`).
        on_line: where :meth:`say` writes.
        try_number: which try of :func:`~torchstep.steps.run_tries` this is (the result's
            ``attempts``); 1 outside that loop.
    """

    #: The last result (also after an interrupt stopped the step), else ``None``.
    result: StepResult | None = None

    def __init__(self, name: str, grace_s: float, on_line: LineCallback | None, try_number: int = 1) -> None:
        self.name = name
        self.grace_s = grace_s
        self.on_line = on_line
        self.try_number = try_number
        self._cancel = threading.Event()

    def say(self, text: str) -> None:
        """A note of torchstep's in the step's log (where its ranks' lines go).

        Args:
            text: the note, one line.
        """
        say(self.on_line, text)

    def cancel(self) -> None:
        """Stop every process of the step (from any thread); ``run`` returns CANCELLED."""
        self._cancel.set()

    def _stop(self, interrupt: BaseException) -> None:
        self.cancel()

    def _run(self, work: Callable[[], StepResult]) -> StepResult:
        box: dict[str, BaseException] = {}
        done = threading.Event()

        def target() -> None:
            try:
                self.result = work()
            except BaseException as e:  # handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

        # Wait on an Event, not Thread.join: a signal handler raising inside join() makes
        # Python 3.11 mark the still-running thread as stopped (bpo-45274's fix misfires).
        threading.Thread(target=target, name=self.name, daemon=True).start()
        try:
            while not done.wait(POLL_S):
                pass
        except BaseException as e:  # timeout alarm, termination, cancellation, Ctrl-C: stop everything first
            self._stop(e)
            limit = self.grace_s + CANCEL_MARGIN_S
            if not self._wait_out(done, limit):
                log.error("torchstep: the step did not stop within %.0f s of the cancel", limit)
            raise
        if "error" in box:
            raise box["error"]
        assert self.result is not None
        self.result.attempts = self.try_number
        return self.result

    def _wait_out(self, done: threading.Event, seconds: float) -> bool:
        """Wait for ``done`` up to ``seconds`` in slices; another interrupt during the wait
        (another signal) is handed to ``_stop`` too and the wait goes on."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if done.wait(POLL_S):
                    return True
            except BaseException as e:
                self._stop(e)
        return done.is_set()
