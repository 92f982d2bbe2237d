"""AppDefs and TorchX component functions as Prefect tasks.

``app_task(app)`` returns a ``prefect.Task`` whose parameters are the component's
parameters (their types in the Prefect UI; flow parameters flow in at run time); calling it
in a flow materialises the AppDef from the actual values and runs it as one step through
core's :func:`torchstep.steps.open_step` (target ``"local"`` or ``"kubernetes"``), every
rank's line going to the task run's logger as it happens. It returns the step
result dict and raises :class:`StepFailed` on failure.

Retries come from the AppDef (APPLICATION → ``retries`` and ``retry_delay_seconds`` from
``plan.step_retry``; a non-retryable failure is never retried: ``retry_condition_fn``; a
:class:`~torchstep.RunError` — the cluster failed the run — is, unless it says retrying
cannot help).
Prefect's ``timeout_seconds`` and the cancellation of the flow run stop every process of
the step before the task ends (TimedOut / Cancelled).

Example::

    from prefect import flow
    from torchstep_prefect import app_task

    train = app_task("components/train.py:trainer", target="local")

    @flow
    def nightly(lr: float = 0.1):
        result = train(lr=lr, replicas=2)       # the step result dict
        return result["outputs"]["loss"]
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from torchstep.adapter import StepFailed as _StepFailed
from torchstep.adapter import StepTask

ORCHESTRATOR = "Prefect"
TARGETS = ("local", "kubernetes")
#: Seconds between two looks at the Jobs of a kubernetes-target step.
POLL_INTERVAL_S = 2.0


class StepFailed(_StepFailed):
    """A torchstep step ended unsuccessfully. ``result`` is the step result dict (state, exit
    code, root cause, per-rank exit codes and log paths), ``retryable`` whether retrying can
    help (False after a ``torchstep.NonRetryableError``: the task is not retried).

    Args:
        message: what failed (the step's failure summary).
        result: the step result dict (``StepResult.to_dict()``).
    """

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(result, message)


def app_task(
    app: Any, *, target: str = "local", cfg: Mapping[str, Any] | None = None, client: Any = None, **task_options: Any
) -> Any:
    """A ``prefect.Task`` running ``app`` (an AppDef, a component function or its reference
    ``"path/file.py:fn"`` / ``"pkg.module:fn"`` / ``"dist.ddp"``) as one torchstep step.

    Args:
        app: the AppDef, component function or reference (above).
        target: ``"local"`` (the agents run in the task's process tree) or
            ``"kubernetes"`` (an Indexed Job per role through ``torchstep.kubernetes.JobGang``).
        cfg: the target's run options (``torchstep runopts local|kubernetes``).
        client: the Kubernetes client of target ``"kubernetes"`` (a
            ``torchstep.kubernetes.KubernetesClient``; default: the kubeconfig or in-cluster config).
        task_options: ``defaults={param: value}`` (a task option here): the values the task's retries are
            computed from when the component needs them (its own defaults otherwise); every other
            keyword is a ``prefect.task`` option (``name``, ``tags``, ``timeout_seconds``,
            ``retries`` — which must agree with the AppDef —, ``log_prints``, ...).

    Returns:
        The task; a call returns the step result dict, or raises :class:`StepFailed`.

    Raises:
        SpecError: an unknown target or run option, an AppDef the target cannot run, or task
            retries or timeout that contradict the AppDef.
    """
    options = dict(task_options)
    step = StepTask(
        app, target=target, cfg=cfg, defaults=options.pop("defaults", None), targets=TARGETS, builder="app_task"
    )
    return task_of(step, client=client, **options)


def task_of(step: StepTask, *, client: Any = None, **task_options: Any) -> Any:
    """The ``prefect.Task`` of a planned :class:`~torchstep.adapter.StepTask` (see
    :func:`app_task`; the generic flow hands the plan it made on arrival).

    Args:
        step: the step, planned.
        client: the Kubernetes client of target ``"kubernetes"``.
        task_options: ``prefect.task`` options.

    Returns:
        The task.

    Raises:
        SpecError: task retries or timeout that contradict the AppDef.
    """
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    options = dict(task_options)
    _apply_retries(step, options)
    body = _step_function(step, client)
    options.setdefault("name", step.name)
    options.setdefault("cache_policy", NO_CACHE)  # a training step has side effects: never skip it
    options.setdefault("persist_result", False)
    user_condition = options.pop("retry_condition_fn", None)
    options["retry_condition_fn"] = _retry_condition(user_condition)
    return task(body, **options)


def torchstep_task(
    fn: Callable[..., Any] | None = None,
    *,
    target: str = "local",
    cfg: Mapping[str, Any] | None = None,
    **task_options: Any,
) -> Any:
    """``@torchstep_task`` / ``@torchstep_task(target="kubernetes", tags=[...])`` on a TorchX
    component function: the function becomes a Prefect task that runs the AppDef it
    returns (see :func:`app_task`).

    Args:
        fn: the component function; ``None`` when the decorator is called with options.
        target: the step's target (:func:`app_task`).
        cfg: the target's run options (:func:`app_task`).
        task_options: ``defaults`` and ``prefect.task`` options (:func:`app_task`).

    Returns:
        The Prefect task, or (called with options) the decorator that makes it.

    Raises:
        SpecError: as :func:`app_task` does, when the function is decorated.

    Example::

        @torchstep_task(retries=2)
        def trainer(lr: float = 0.1, replicas: int = 2) -> specs.AppDef:
            ...
    """
    if fn is None:
        return lambda f: app_task(f, target=target, cfg=cfg, **task_options)
    return app_task(fn, target=target, cfg=cfg, **task_options)


def _apply_retries(step: StepTask, options: dict[str, Any]) -> None:
    """Prefect's retries from the plan, after checking the user's agree with it."""
    delay = options.get("retry_delay_seconds")
    step.check_user_retries(
        retries=options.get("retries"),
        timeout=options.get("timeout_seconds"),
        retry_delay=delay if isinstance(delay, int | float) and not isinstance(delay, bool) else None,
        orchestrator=ORCHESTRATOR,
    )
    if step.retries:
        options.setdefault("retries", step.retries)
        if "retry_delay_seconds" not in options:
            options["retry_delay_seconds"] = step.delays(0.0) or 0


def _retry_condition(user: Callable[..., bool] | None) -> Callable[..., bool]:
    def torchstep_retry_condition(task: Any, task_run: Any, state: Any) -> bool:
        exc = getattr(state, "data", None)
        if isinstance(exc, BaseException) and not StepTask.retryable(exc):
            return False  # torchstep.NonRetryableError, or a RunError that says so: retrying cannot help
        return True if user is None else bool(user(task, task_run, state))

    return torchstep_retry_condition


def _step_function(step: StepTask, client: Any) -> Any:
    """The task's function: typed parameters from the component, the step in the body. A
    call with the values the task was planned with (or of a fixed AppDef) runs the task's
    plan; other values are planned once per call."""

    def run_step(**values: Any) -> dict[str, Any]:
        app_def, plan = step.call(values)
        return run_in_task(app_def, plan, cfg=step.cfg, client=client)

    return step.function(run_step)


def run_in_task(app: Any, plan: Any, *, cfg: dict[str, Any], client: Any = None) -> dict[str, Any]:
    """Run ``plan`` (of the AppDef ``app``) as one try of the current Prefect task run
    through core's :func:`~torchstep.steps.open_step`; the step result dict. A local try is
    named after the task run and its run count; a Kubernetes one after the task's call in
    the flow run (:func:`_logical_call`: Prefect keeps no state between tries)."""
    from prefect import get_run_logger
    from prefect.context import TaskRunContext
    from torchstep.adapter import Attempt, failure_summary, open_step, publish

    from torchstep_prefect.artifacts import ArtifactSink

    ctx = TaskRunContext.get()
    run = ctx.task_run if ctx is not None else None
    flow_run = getattr(run, "flow_run_id", None) or "flow"
    if plan.target == "local":
        attempt = Attempt(("prefect", flow_run, getattr(run, "id", None) or "task"), getattr(run, "run_count", 1))
        options: dict[str, Any] = {}
    else:
        attempt = _logical_call(flow_run, getattr(run, "task_key", None) or app.name, app, getattr(run, "id", None))
        options = {"client": client, "poll_interval": POLL_INTERVAL_S}
    step = open_step(plan, attempt=attempt, cfg=cfg, on_line=get_run_logger().info, **options)
    task_name = ctx.task.name if ctx is not None else app.name  # the artifacts' key
    try:
        result = _run_stopping_on_timeout_and_cancel(step, ctx)
    except BaseException:
        if step.result is not None:  # stopped (cancelled, timed out) with a result: the UI shows it too
            publish(step.result, ArtifactSink(task_name))
        raise
    publish(result, ArtifactSink(task_name))
    data = result.to_dict()
    if not result.succeeded:
        raise StepFailed(failure_summary(result), data)
    return data


#: Per flow-run execution (its FlowRunContext, held weakly: an ``id()`` is reused once the
#: old context is freed, which would carry the counts over into a re-execution): the call
#: number of each (task, AppDef) pair and of each task run.
_CALLS: dict[str, tuple[Any, dict[str, int], dict[str, int]]] = {}
_CALLS_LOCK = threading.Lock()


def _logical_call(flow_run: Any, task_key: str, app: Any, task_run: Any) -> Any:
    """The identity of this task call within its flow run, the same when the flow run is
    executed again after its process died (its infrastructure restarts it): flow run, task,
    a hash of the AppDef, and the how-many-th call of that pair this execution is (a retry of
    the same task run keeps its number). Prefect's own task run id and dynamic key are
    random per execution, so they cannot name the Jobs. Two identical calls may swap numbers
    in a concurrent re-execution: harmless, their Jobs are the same."""
    import hashlib
    import json
    import weakref

    from prefect.context import FlowRunContext
    from torchstep.adapter import Attempt, app_to_dict

    digest = hashlib.sha256(json.dumps(app_to_dict(app), sort_keys=True, default=str).encode()).hexdigest()[:10]
    ctx = FlowRunContext.get()
    key = f"{task_key}/{digest}"
    with _CALLS_LOCK:
        for ended in [k for k, (ref, _, _) in _CALLS.items() if ref() is None and k != str(flow_run)]:
            del _CALLS[ended]  # a served flow process runs many flow runs: forget finished ones
        seen, counts, runs = _CALLS.get(str(flow_run), (None, {}, {}))
        if seen is None or seen() is not ctx:  # a new execution of this flow run counts from 0
            counts, runs = {}, {}
        if str(task_run) not in runs:
            counts[key] = runs[str(task_run)] = counts.get(key, -1) + 1
        _CALLS[str(flow_run)] = (weakref.ref(ctx) if ctx is not None else lambda: None, counts, runs)
        n = runs[str(task_run)]
    return Attempt(("prefect", flow_run, task_key, digest, n))


def _run_stopping_on_timeout_and_cancel(step: Any, ctx: Any) -> Any:
    """``step.run()``, with the two stops Prefect cannot deliver to blocking code itself.

    - ``timeout_seconds`` in a worker thread (``.submit()``): Prefect only raises its
      timeout once the blocking call returns, so the step is cancelled here when the time
      is up, and the task ends ``TimedOut`` (``TaskRunTimeoutError``). In the main thread
      Prefect's own timeout reaches the step's wait, which stops every process first.
    - The flow run cancelled (the runner's SIGTERM → ``TerminationSignal``): once the step
      has stopped every process, the task run is set ``Cancelled`` and ``Abort`` raised —
      Prefect's task engine would mark any ``TerminationSignal`` ``Crashed``.
    """
    import threading

    from prefect.exceptions import TerminationSignal
    from prefect.task_engine import TaskRunTimeoutError
    from torchstep.adapter import run_with_deadline

    seconds = getattr(getattr(ctx, "task", None), "timeout_seconds", None)
    in_worker = threading.current_thread() is not threading.main_thread()
    try:
        result, expired = run_with_deadline(step, seconds if in_worker else None)
    except TerminationSignal:
        if _flow_run_cancelling(ctx):
            _mark_cancelled(ctx)
            from prefect.exceptions import Abort

            raise Abort("the flow run was cancelled: every process of the step has stopped") from None
        raise
    if expired:
        raise TaskRunTimeoutError(f"Scope timed out after {seconds} second(s): every process of the step was stopped.")
    return result


def _flow_run_cancelling(ctx: Any) -> bool:
    run = getattr(ctx, "task_run", None)
    if run is None or run.flow_run_id is None:
        return False
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            state = client.read_flow_run(run.flow_run_id).state
        return state is not None and (state.is_cancelling() or state.is_cancelled())
    except Exception:  # the API is gone too: a plain termination
        return False


def _mark_cancelled(ctx: Any) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(
                ctx.task_run.id,
                Cancelled(message="the flow run was cancelled; every process of the step stopped"),
                force=True,
            )
    except Exception:  # best effort: the step has stopped either way
        pass
