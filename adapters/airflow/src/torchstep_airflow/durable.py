"""Durable Job path of ``AppDefOperator`` (target ``kubernetes``, several replicas or roles):
a retry after the worker died reattaches to the Job instead of starting a second gang.

With Airflow's ``ResumableJobMixin`` (3.3+) and a ``task_state_store`` in the context, the
"external id" is the run id of the try that submitted (its objects' names are a hash of it),
kept in the task state store under :data:`RUN_ID_KEY`. The mixin decides from it:

- ``RUNNING`` on the cluster → reattach (logs continue after the cursor core's ``JobGang``
  saves in the same store under ``torchstep_log_cursor``). Reattaching, like collecting a
  finished Job's result, requires the uid ``JobGang`` recorded in the same store when it
  created the Job (``torchstep_workload_uids``): a Job with the run's labels and another uid
  (made by someone else, in advance) is refused by name, and nothing is deleted;
- ``SUCCEEDED`` → its result, collected without running anything again (same XCom);
- ``PENDING`` (nothing of it exists: never created, or deleted) → attach-or-create under
  that id. The id is stored *before* anything is created, so the mixin's documented
  submit/persist window is closed: a crash at any point leaves an id that resolves;
- ``FAILED`` (failed while nobody watched) → its objects are settled as ``on_finish_action``
  says and its failure is logged; a fresh Job for the current try follows (the mixin's
  "terminal → resubmit"), unless the failure was non-retryable: then this try reports it;
- ``REPORTED`` (a try watched that id to its end and reported it, :data:`REPORTED_KEY`) →
  a fresh Job for the current try: a retry after a reported failure, or a cleared task,
  runs again.

Without the mixin (Airflow < 3.3) or without a task state store, a retry still cannot start
a duplicate: the step runs under a name derived from the task's logical attempt (dag, task,
map index, DAG run; not the try): core's :func:`~torchstep.steps.open_step` of an
:class:`~torchstep.steps.Attempt` without a try number attaches to a running or finished Job
of that attempt and skips failed ones.

Nothing here imports the Kubernetes client or the provider: it opens each try's step with
the ``open_try`` it is given (core's ``open_step`` bound to the task's plan and client).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torchstep import StepResult, StepState
from torchstep.adapter import FAILED, PENDING, RUNNING, SUCCEEDED, Attempt, failure_summary

from torchstep_airflow.settings import attempt_of

#: The task state store key of the run id whose Job this task instance runs (the mixin's
#: ``external_id_key``; renaming it breaks in-flight retries).
RUN_ID_KEY = "torchstep_run_id"
#: The task state store key of the last run id a try watched to its end and reported.
REPORTED_KEY = "torchstep_reported"
#: The state beside core's PENDING / RUNNING / SUCCEEDED / FAILED (see the module docstring).
REPORTED = StepState.REPORTED
#: The module of Airflow's mixin (3.3+).
MIXIN_MODULE = "airflow.sdk.bases.resumablejobmixin"


class Settled(Exception):
    """A try that reports an earlier Job's non-retryable failure instead of submitting."""

    def __init__(self, result: StepResult) -> None:
        super().__init__(result.message)
        self.result = result


#: Opens the step of one try: ``open_try(attempt, cursor_store=None)`` (core's ``open_step``).
OpenTry = Callable[..., Any]


#: Hands a try's step to the triggerer: ``defer(step)`` creates (or attaches to) its Jobs and
#: raises ``TaskDeferred``.
Defer = Callable[[Any], None]


def run_durable(open_try: OpenTry, context: Any, log: Any, defer: Defer | None = None) -> StepResult:
    """Run the Job path of a task durably (see the module docstring); its result, failed or
    not. With ``defer`` (``deferrable=True``), a try whose Jobs are running (created now, or
    found running after a crash) is handed to the triggerer instead of watched here:
    :func:`resume_durable` continues it in ``execute_complete``."""
    store = context.get("task_state_store")
    cls = resumable_class()
    attempt = attempt_of(context)
    if cls is None or store is None:
        why = "Airflow has no ResumableJobMixin (< 3.3)" if cls is None else "no task_state_store in the context"
        log.warning(
            "torchstep: %s: the Job is named after the task's attempt %s (not the try), so a retry "
            "after a crash attaches to it instead of starting another",
            why,
            attempt.logical_id,
        )
        step = open_try(Attempt(attempt.parts))
        if defer is not None:
            defer(step)
        return step.run()  # type: ignore[no-any-return]
    job = cls(open_try, attempt.run_id, store, log, defer)
    try:
        job.execute_resumable(context)
    except Settled as s:
        return s.result
    assert job.outcome is not None
    return job.outcome  # type: ignore[no-any-return]


def resumable_class() -> Any:
    """The :class:`ResumableJobMixin` subclass that runs the Job path of a task, or None
    where the installed Airflow lacks the mixin. Imported when a durable task executes,
    never when a DAG file is parsed."""
    try:
        from airflow.sdk.bases.resumablejobmixin import ResumableJobMixin
    except ImportError:
        return None

    class ResumableStep(ResumableJobMixin):
        """The mixin's submit / status / poll / result over core's attach-or-create.

        "Submitting" only reserves the identity (stores this try's run id); creating is
        attach-or-create inside ``poll_until_complete``, so the mixin's own persist after
        ``submit_job`` only repeats a value already stored. The mixin returns what
        ``poll_until_complete`` returns on a reconnect and ``get_job_result`` otherwise: both
        leave the step result in ``outcome``, which :func:`run_durable` returns.
        """

        external_id_key = RUN_ID_KEY

        # Not the mixin's __init__: it is an operator's (wrapped by BaseOperatorMeta) and only sets `durable`.
        def __init__(self, open_try: OpenTry, run_id: str, store: Any, log: Any, defer: Defer | None = None) -> None:
            self.durable = True
            self.defer = defer
            self.open_try = open_try
            self.run_id = run_id  # this try's
            self.store = store
            self.log = _kwargs_logger(log)  # the mixin logs structlog-style (key=value keywords)
            self.outcome: StepResult | None = None
            self._failed: str | None = None  # an earlier run id whose Job failed while nobody watched
            self._opened: dict[str, Any] = {}  # run id -> its step, opened to read its state

        def get_job_status(self, external_id: Any, context: Any) -> str:
            run_id = str(external_id)
            if self.store.get(REPORTED_KEY) == run_id:
                return str(REPORTED)  # the mixin gets plain strings
            step = self._opened[run_id] = self.open_try(run_id, cursor_store=self.store)
            state = step.found
            if state == FAILED:
                self._failed = run_id
            return str({None: PENDING, RUNNING: RUNNING, SUCCEEDED: SUCCEEDED, FAILED: FAILED}.get(state, state))

        def is_job_active(self, status: str) -> bool:
            return status in (RUNNING, PENDING)

        def is_job_succeeded(self, status: str) -> bool:
            return status == SUCCEEDED

        def submit_job(self, context: Any) -> str:
            if self._failed is not None:
                self._settle(self._failed)
            # Stored before anything exists: a crash from here on leaves an id that attach-or-create resolves.
            self.store.set(RUN_ID_KEY, self.run_id)
            return self.run_id

        def poll_until_complete(self, external_id: Any, context: Any) -> None:
            if self.defer is not None:  # created (or attached) here, waited for in the triggerer
                run_id = str(external_id)
                self.defer(self._opened.pop(run_id, None) or self.open_try(run_id, cursor_store=self.store))
            self.outcome = self._run(str(external_id))

        def get_job_result(self, external_id: Any, context: Any) -> Any:
            if self.outcome is None:  # succeeded while nobody watched: attaching collects its result
                self.outcome = self._run(str(external_id))
            return self.outcome

        def _run(self, run_id: str) -> StepResult:
            step = self._opened.pop(run_id, None) or self.open_try(run_id, cursor_store=self.store)
            try:
                return step.run()  # type: ignore[no-any-return]
            finally:
                # Watched to its end, or deleted (core deletes everything on any exception; a
                # SIGKILL never gets here): the next try of this task starts afresh.
                try:
                    self.store.set(REPORTED_KEY, run_id)
                except Exception as e:
                    self.log.warning("torchstep: could not record that %s was reported: %s", run_id, e)

        def _settle(self, run_id: str) -> None:
            """Attach to an earlier Job that failed unwatched: its remaining log lines, its
            result, its objects cleaned as ``on_finish_action`` says; a non-retryable failure
            ends this try (no retry layer may rerun it)."""
            self.log.warning("torchstep: the Job of %s failed while nobody watched it; collecting it", run_id)
            result = self._run(run_id)
            self.log.warning("torchstep: earlier Job %s: %s", run_id, failure_summary(result))
            if result.state == FAILED and not result.retryable:
                raise Settled(result)

    return ResumableStep


def resume_durable(open_try: OpenTry, run_id: str, context: Any) -> StepResult:
    """The end of a deferred try (``execute_complete``): reattach to the Jobs of ``run_id``,
    follow every pod's log from the saved cursor, collect, clean up; then record that this
    run was reported (the next try of the task starts afresh), as the non-deferred path does.

    Args:
        open_try: opens the step of a run id (core's ``open_step``, bound to the task).
        run_id: the deferred try's run id (the trigger's event says it).
        context: the task's Airflow context (its ``task_state_store``, when it has one).

    Returns:
        The step result, failed or not.
    """
    store = context.get("task_state_store")
    step = open_try(run_id, cursor_store=store)
    try:
        return step.run()  # type: ignore[no-any-return]
    finally:
        if store is not None:
            try:
                store.set(REPORTED_KEY, run_id)
            except Exception as e:
                logging.getLogger("torchstep_airflow").warning(
                    "torchstep: could not record that %s was reported: %s", run_id, e
                )


def _kwargs_logger(log: Any) -> Any:
    """``log`` if it takes keyword fields (Airflow's structlog loggers), else an adapter
    that appends them to the message (a stdlib logger)."""
    return _KeywordAdapter(log) if isinstance(log, logging.Logger | logging.LoggerAdapter) else log


class _KeywordAdapter:
    def __init__(self, log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
        self._log = log

    def __getattr__(self, level: str) -> Any:
        method = getattr(self._log, level)

        def call(msg: str, *args: Any, **fields: Any) -> Any:
            extra = " ".join(f"{k}={v!r}" for k, v in fields.items())
            return method(f"{msg} {extra}" if extra else msg, *args)

        return call
