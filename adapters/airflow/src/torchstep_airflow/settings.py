"""Airflow task settings derived from a StepPlan: retries, retry timing and timeouts, and
the run id that names one try of a task. Pure functions (no Airflow import), so the rules
are testable without a scheduler.

One retry layer, never two: the task's own retries and timeouts are checked against the
plan by core's :func:`torchstep.steps.check_user_retries` (docs/steps.md); the plan's
``step_retry`` becomes ``retries`` / ``retry_delay`` / ``retry_exponential_backoff`` /
``max_retry_delay``, and its step timeout an ``execution_timeout`` backstop 60 s later.

Example::

    >>> import torchstep
    >>> from torchx import specs
    >>> role = specs.Role("w", image="", entrypoint="true", max_retries=2,
    ...                   metadata={"torchstep": {"retry_delay": 5}})
    >>> plan = torchstep.build_plan(specs.AppDef("app", roles=[role]), "local")
    >>> task_settings(plan, UserSettings(), "local")
    {'retries': 2, 'retry_delay': datetime.timedelta(seconds=5)}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchstep import SpecError
from torchstep.adapter import waits_in_queue

if TYPE_CHECKING:  # the planner and the steps seam load on use: a DAG file's re-parse needs neither
    from torchstep import StepPlan
    from torchstep.adapter import Attempt

#: Seconds added to the plan's step timeout for Airflow's ``execution_timeout`` backstop:
#: the runner stops the step first and reports it; Airflow fires only if the runner hangs.
TIMEOUT_MARGIN_S = 60.0


@dataclass(frozen=True)
class UserSettings:
    """What the DAG author set on the task (arguments or ``default_args``); None = unset."""

    retries: int | None = None
    retry_delay: timedelta | float | None = None
    retry_exponential_backoff: float | None = None
    max_retry_delay: timedelta | float | None = None
    execution_timeout: timedelta | None = None


def _seconds(value: timedelta | float | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def task_settings(plan: StepPlan, user: UserSettings, target: str, queued: bool = False) -> dict[str, Any]:
    """The BaseOperator keyword arguments the plan implies (only those it sets).

    ``queued``: the step's Jobs wait in a Kueue queue (the kubernetes run option ``queue``).
    Then no ``execution_timeout`` is derived from the step timeout: Airflow's counts wall
    time, the wait for admission included, while the step's own timeout (the Jobs'
    ``activeDeadlineSeconds``) counts from admission (docs/kubernetes.md, "Kueue").

    Raises :class:`~torchstep.SpecError` when the task's own settings would add a second
    retry layer or contradict the AppDef.
    """
    from torchstep.adapter import check_user_retries

    check_user_retries(
        plan,
        retries=user.retries,
        timeout=_seconds(user.execution_timeout),
        retry_delay=_seconds(user.retry_delay),
        retry_backoff=user.retry_exponential_backoff,
        max_retry_delay=_seconds(user.max_retry_delay),
        orchestrator="Airflow",
    )
    out: dict[str, Any] = {}
    step = plan.step_retry
    if step.count:
        out["retries"] = step.count
        if step.delay_s is not None:
            out["retry_delay"] = timedelta(seconds=step.delay_s)
        if step.backoff is not None:
            out["retry_exponential_backoff"] = step.backoff
        if step.max_delay_s is not None:
            out["max_retry_delay"] = timedelta(seconds=step.max_delay_s)
    if plan.timeout_s is not None and user.execution_timeout is None and not queued:
        out["execution_timeout"] = timedelta(seconds=plan.timeout_s + TIMEOUT_MARGIN_S)
    return out


def check_run_settings(
    plan: StepPlan, user: UserSettings, target: str, parsed: dict[str, Any] | None, task: Any
) -> None:
    """At execute time: the rendered AppDef must want the settings the task was parsed with.

    ``parsed`` is what :func:`task_settings` gave when the DAG was parsed, or None when
    the plan could not be built then (templated ``app_args``). The scheduler fixed the
    task's ``retries`` at parse time, so a difference is an error (the fix: set the value
    on the task) rather than a silently dropped field.
    """
    wanted = task_settings(plan, user, target, waits_in_queue(target, getattr(task, "cfg", None)))
    if parsed is not None:
        diff = sorted(k for k in wanted.keys() | parsed.keys() if wanted.get(k) != parsed.get(k))
        have = {k: parsed.get(k) for k in diff}
    else:
        diff = sorted(k for k, v in wanted.items() if not _same(getattr(task, k, None), v))
        have = {k: getattr(task, k, None) for k in diff}
    if diff:
        want = ", ".join(f"{k}={wanted.get(k)}" for k in diff)
        got = ", ".join(f"{k}={v}" for k, v in have.items())
        raise SpecError(
            "app_args",
            target,
            f"after rendering, the AppDef wants {want} but the task was parsed with {got} "
            "(templated app_args change the retry settings, which Airflow fixes when it parses the DAG)",
            fix=f"set {want} on the task explicitly",
        )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, timedelta | int | float) and isinstance(b, timedelta | int | float):
        return _seconds(a) == _seconds(b)
    return bool(a == b)


def task_run_id(dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int = -1) -> str:
    """The run id of one try of one task: :func:`torchstep.steps.step_run_id` of the DAG,
    the task, its map index, the DAG run and the try (Airflow's own argument order; the
    core function takes the parts in order). Unique per try, stable within it: it names the
    app id, the rendezvous and the Kubernetes objects of that try.

    Args:
        dag_id: the DAG.
        run_id: the DAG run.
        task_id: the task.
        try_number: the task instance's try (1, 2, ...).
        map_index: the index of a mapped task (-1: not mapped).

    Returns:
        The run id.

    >>> task_run_id("train", "manual__2026-11-21T10:00:00+00:00", "fit", 2)
    'train.fit.manual-2026-11-21t10-00-00-00-00.try2-f5e55d'
    >>> task_run_id("train", "scheduled__x", "fit", 1, map_index=3)
    'train.fit.3.scheduled-x.try1-838bd3'
    """
    from torchstep.adapter import Attempt

    return Attempt((dag_id, task_id, *([map_index] if map_index >= 0 else []), run_id), try_number).run_id


def attempt_of(context: Any) -> Attempt:
    """The task instance of an Airflow task ``context`` as the seam's
    :class:`~torchstep.steps.Attempt`: the logical attempt (dag, task, map index, DAG run)
    and the try."""
    ti = context["ti"]
    map_index = getattr(ti, "map_index", None)
    mapped = [map_index] if map_index is not None and map_index >= 0 else []
    from torchstep.adapter import Attempt

    return Attempt((ti.dag_id, ti.task_id, *mapped, ti.run_id), int(ti.try_number or 1))


def run_id_of(context: Any) -> str:
    """:func:`task_run_id` from an Airflow task context."""
    return attempt_of(context).run_id
