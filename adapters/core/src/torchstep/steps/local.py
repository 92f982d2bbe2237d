"""The local step kind: one try of a plan for the local target, in the orchestrator's worker
process (:class:`LocalStep`), and what only a local run owns: retries of the whole app from
its cfg table (``torchstep run``, ``run_local``) and its ``result.json``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torchstep.errors import SpecError
from torchstep.local.status import PlainDisplay, ReplicaEvent
from torchstep.plan.model import StepPlan, StepRetry
from torchstep.steps.backend import check_plan, with_run_id
from torchstep.steps.runner import CancellableRunner, LineCallback

if TYPE_CHECKING:
    from torchstep.result import StepResult

__all__ = ["LocalStep", "take_retry_cfg"]

#: The local cfg table's keys that configure :func:`~torchstep.steps.run_tries`, not one try.
RETRY_KEYS = ("retries", "retry_delay")


class LocalStep(CancellableRunner):
    """One try of a plan for the local target, in the orchestrator's worker process.

    Args:
        plan: ``torchstep.build_plan(app, "local")``.
        run_id: the try's run id (:func:`~torchstep.steps.step_run_id`; the app id is
            ``<app>-<hash of it>``); ``None``: a fresh random app id.
        cfg: the local cfg table (``torchstep runopts local``); ``run_id`` and ``retries``
            are the orchestrator's and refused here.
        on_line: receives each rank's output line (``[role/rank]`` prefixed) and torchstep's
            own notes as they happen (default: printed).
        on_status: receives each replica state change (:class:`ReplicaEvent`).
        app_id: the exact app id (and run directory name) instead of one made from ``run_id``.
        display: where the lines go instead of ``on_line`` (``torchstep run``'s live table).
        try_number: which try of :func:`~torchstep.steps.run_tries` this is (the result's
            ``attempts``); 1 outside that loop.

    Raises:
        SpecError: a plan for another target, or a bad option.

    ``run()`` blocks and returns the :class:`~torchstep.StepResult`; ``cancel()`` from any
    thread stops every process (SIGTERM, the grace period, SIGKILL); a second Ctrl-C while
    it stops kills at once. The step never retries the whole app
    (:func:`~torchstep.steps.run_tries` does).

    Example::

        step = LocalStep(plan, run_id=step_run_id(flow_run_id, task_run_id), on_line=logger.info)
        result = step.run()  # blocks; step.cancel() from another thread stops it
    """

    def __init__(
        self,
        plan: StepPlan,
        *,
        run_id: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        on_line: LineCallback | None = None,
        on_status: Callable[[ReplicaEvent], None] | None = None,
        app_id: str | None = None,
        display: PlainDisplay | None = None,
        try_number: int = 1,
    ) -> None:
        from torchstep.local import resolve

        self.plan = check_plan(plan, "local")
        options = with_run_id(cfg, run_id, "local")
        if options.get("retries"):
            raise SpecError("cfg['retries']", "local", "the orchestrator owns the step's retries", fix="remove it")
        self.options = resolve(options)
        self.run_id = run_id
        self.app_id = app_id
        self.on_status = on_status
        self._kill = threading.Event()
        if display is None and on_line is not None:
            display = CallbackDisplay(on_line, show_output=self.options.tee)
        self.display = display or PlainDisplay(show_output=self.options.tee)
        name = f"torchstep-local-{run_id or app_id or plan.app_name}"
        super().__init__(name, float(self.options.grace_period), on_line, try_number)

    def say(self, text: str) -> None:
        """A note of torchstep's in the step's log (where its ranks' lines go).

        Args:
            text: the note, one line.
        """
        self.display.note(text)

    def run(self) -> StepResult:
        """Run to the end and return the step result (re-raises what interrupts the wait,
        after every process of the step has stopped).

        Returns:
            The step result, also in ``<log_dir>/<app_id>/result.json``.
        """
        from torchstep.local import run_plan

        def work() -> StepResult:
            return run_plan(
                self.plan,
                self.options,
                cancel=self._cancel,
                kill=self._kill,
                attempt=self.try_number,
                on_status=self.on_status,
                display=self.display,
                app_id=self.app_id,
            )

        return self._run(work)

    def kill(self) -> None:
        """Stop every process of the step at once (SIGKILL, no grace period)."""
        self._kill.set()
        self.cancel()

    def record(self, result: StepResult) -> None:
        """Rewrite the run directory's ``result.json`` with ``result`` (decided after the run:
        cancelled while waiting to retry).

        Args:
            result: the try's final result.
        """
        if result.log_dir:
            from torchstep.local.supervisor import write_run_result

            write_run_result(result, f"{result.log_dir}/result.json", self.display)

    def _stop(self, interrupt: BaseException) -> None:
        if isinstance(interrupt, KeyboardInterrupt) and self._cancel.is_set():
            self.kill()  # a second Ctrl-C: no more grace
        self.cancel()


def take_retry_cfg(plan: StepPlan, cfg: Mapping[str, Any]) -> tuple[dict[str, Any], int | None, StepRetry]:
    """Split the local cfg table's retries of the whole app off a try's options.

    ``torchstep run`` and ``run_local`` own the APPLICATION budget themselves, from
    ``cfg["retries"]`` and ``cfg["retry_delay"]``; one try (:class:`LocalStep`) refuses them.

    Args:
        plan: the local plan (its ``step_retry`` is the default).
        cfg: the local cfg table.

    Returns:
        ``cfg`` without those keys, ``cfg["retries"]`` (``None`` when unset), and the plan's
        :class:`StepRetry` with ``retry_delay`` applied.

    Raises:
        SpecError: a bad value of either key.
    """
    rest = {k: v for k, v in cfg.items() if k not in RETRY_KEYS}
    if not set(RETRY_KEYS) & cfg.keys():
        return rest, None, plan.step_retry
    from torchstep.local import resolve

    opts = resolve({k: v for k, v in cfg.items() if k in RETRY_KEYS})
    delay = opts.retry_delay if opts.retry_delay is not None else plan.step_retry.delay_s
    return rest, opts.retries, replace(plan.step_retry, delay_s=delay)


class CallbackDisplay(PlainDisplay):
    """A local run's display that hands every line to a callback (a logger).

    Args:
        on_line: receives every line.
        show_output: whether the ranks' output lines are shown (the ``tee`` option).
    """

    def __init__(self, on_line: LineCallback, *, show_output: bool) -> None:
        super().__init__(show_output=show_output)
        self._on_line = on_line

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self._on_line(text)
            except Exception:  # a logger that fails must not stop the run
                pass
