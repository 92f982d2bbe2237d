"""The retry loop: :func:`run_tries`, the one APPLICATION retry loop of an entry point that
owns the budget itself (``torchstep run``, the ``torchstep_local`` scheduler, the KFP launcher
step under ``kfp.local``, Airflow's generic DAG): the plan's delays, the non-retryable verdict
and cancellation."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from torchstep.errors import SpecError
from torchstep.local.status import PlainDisplay, ReplicaEvent
from torchstep.plan.model import StepPlan
from torchstep.result import CANCELLED, is_retryable
from torchstep.steps.dispatch import open_step
from torchstep.steps.ids import AttemptLike, again, as_attempt
from torchstep.steps.kubernetes import KubernetesStep
from torchstep.steps.local import LocalStep, take_retry_cfg
from torchstep.steps.runner import POLL_S, LineCallback

if TYPE_CHECKING:
    from torchstep.kubernetes.client import KubernetesClient
    from torchstep.kubernetes.jobs import CursorStore
    from torchstep.result import StepResult

__all__ = ["DEFAULT_RETRY_DELAY_S", "run_tries", "run_until_cancelled"]

#: The wait before a retry whose delay the AppDef leaves unset (``retry_delay``).
DEFAULT_RETRY_DELAY_S = 1.0


def run_tries(
    plan: StepPlan,
    *,
    attempt: AttemptLike,
    cfg: Mapping[str, Any] | None = None,
    client: KubernetesClient | None = None,
    on_line: LineCallback | None = None,
    cursor_store: CursorStore | None = None,
    retries: int | None = None,
    cancel: threading.Event | None = None,
    on_step: Callable[[LocalStep | KubernetesStep], object] | None = None,
    on_retry: Callable[[StepResult, int, float], None] | None = None,
    on_status: Callable[[ReplicaEvent], None] | None = None,
    app_id: str | None = None,
    display: PlainDisplay | None = None,
    poll_interval: float | None = None,
    on_finish: str | None = None,
    result_file: str | None = None,
) -> StepResult:
    """Run ``plan`` up to ``retries + 1`` times until it succeeds, is cancelled or fails
    non-retryably; each try is :func:`~torchstep.steps.open_step` of its own attempt
    (:meth:`~torchstep.steps.Attempt.again`), and ``attempts`` in the result counts them.

    Args:
        plan: the plan (local or kubernetes target).
        attempt: as :func:`~torchstep.steps.open_step`: the first try's (try ``n``:
            :meth:`~torchstep.steps.Attempt.again`, or a run id with ``.try<n>``).
        cfg: as :func:`~torchstep.steps.open_step`; for the local target ``cfg["retries"]``
            and ``cfg["retry_delay"]`` configure this loop.
        client: as :func:`~torchstep.steps.open_step`.
        on_line: as :func:`~torchstep.steps.open_step`.
        cursor_store: as :func:`~torchstep.steps.open_step`.
        retries: how many retries at most; ``None``: ``cfg["retries"]``, else the plan's
            APPLICATION budget (``plan.step_retry.count``).
        cancel: set from any thread (or a signal handler): the running try stops every
            process, a wait for the next try ends, and the result is CANCELLED.
        on_step: called with each try's step before it runs, for an orchestrator whose kill
            arrives as a callback (it cancels the step; an interrupt leaves the stopped
            result in ``step.result``).
        on_retry: called with the failed result, its try number and the wait before the
            next try (the loop says it in the step's log itself).
        on_status: as :func:`~torchstep.steps.open_step`.
        app_id: as :func:`~torchstep.steps.open_step`; try ``n`` gets ``<app_id>-try<n>``.
        display: as :func:`~torchstep.steps.open_step`.
        poll_interval: as :func:`~torchstep.steps.open_step`.
        on_finish: as :func:`~torchstep.steps.open_step`.
        result_file: as :func:`~torchstep.steps.open_step`.

    Returns:
        The last try's :class:`~torchstep.StepResult`.

    Raises:
        SpecError: as :func:`~torchstep.steps.open_step`, or a bad ``retries``; anything
            that interrupts a try, after the try stopped.
        RunError: a logical attempt's try cannot be found on the cluster (too many failed
            tries kept).

    Example::

        result = run_tries(plan, attempt=Attempt(("kfp", job_id, task_id)), on_line=print)
    """
    cfg = dict(cfg or {})
    step_retry = plan.step_retry
    if plan.target == "local":  # only a local run takes its retries from its cfg table
        cfg, from_cfg, step_retry = take_retry_cfg(plan, cfg)
        retries = from_cfg if retries is None else retries
    retries = step_retry.count if retries is None else retries
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise SpecError("retries", plan.target, f"must be a whole number >= 0, got {retries!r}", fix="e.g. retries=2")
    delays = replace(step_retry, count=retries).delays(DEFAULT_RETRY_DELAY_S)
    first = as_attempt(attempt)
    n = 1
    while True:
        step = open_step(
            plan,
            attempt=again(first, n),
            cfg=cfg,
            client=client,
            on_line=on_line,
            cursor_store=cursor_store,
            on_status=on_status,
            app_id=f"{app_id}-try{n}" if app_id and n > 1 else app_id,
            display=display,
            poll_interval=poll_interval,
            on_finish=on_finish,
            result_file=result_file,
            try_number=n,
        )
        if on_step is not None:
            on_step(step)
        result = run_until_cancelled(step, cancel)
        # the one rule: never after SUCCEEDED or CANCELLED, nor after a non-retryable failure
        if not is_retryable(result.state, non_retryable=not result.retryable) or n > retries:
            if n > 1 or retries:
                step.say(f"{result.state} after {n} tr{'y' if n == 1 else 'ies'} (at most {retries + 1})")
            return result
        delay = delays[n - 1]
        step.say(
            f"try {n} of {retries + 1} failed ({result.state}, exit code {result.exit_code}); retrying in {delay:g} s"
        )
        if on_retry is not None:
            on_retry(result, n, delay)
        if (cancel or threading.Event()).wait(delay):  # a fresh Event: an interruptible sleep
            result.state, result.message = CANCELLED, "cancelled while waiting to retry"
            result.retryable = is_retryable(result.state)
            step.record(result)
            return result
        n += 1


def run_until_cancelled(step: LocalStep | KubernetesStep, cancel: threading.Event | None) -> StepResult:
    """``step.run()``, cancelled as soon as ``cancel`` is set (by a watcher thread).

    Args:
        step: the opened step.
        cancel: the event; ``None``: just ``step.run()``.

    Returns:
        The step result (CANCELLED when the event stopped it).
    """
    if cancel is None:
        return step.run()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(POLL_S):
                step.cancel()
                return

    if cancel.is_set():
        step.cancel()
    threading.Thread(target=watch, name="torchstep-cancel-watch", daemon=True).start()
    try:
        return step.run()
    finally:
        done.set()
