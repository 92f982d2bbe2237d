"""Dispatch: :func:`open_step`, the step of one try, of the kind its plan's target names."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchstep.errors import SpecError
from torchstep.local.status import PlainDisplay, ReplicaEvent
from torchstep.plan.model import StepPlan
from torchstep.steps.backend import check_plan
from torchstep.steps.ids import Attempt, AttemptLike, as_attempt, run_id_of
from torchstep.steps.kubernetes import KubernetesStep
from torchstep.steps.local import LocalStep
from torchstep.steps.runner import LineCallback

if TYPE_CHECKING:
    from torchstep.kubernetes.client import KubernetesClient
    from torchstep.kubernetes.jobs import CursorStore

__all__ = ["open_step"]


def open_step(
    plan: StepPlan,
    *,
    attempt: AttemptLike,
    cfg: Mapping[str, Any] | None = None,
    client: KubernetesClient | None = None,
    on_line: LineCallback | None = None,
    cursor_store: CursorStore | None = None,
    on_status: Callable[[ReplicaEvent], None] | None = None,
    app_id: str | None = None,
    display: PlainDisplay | None = None,
    poll_interval: float | None = None,
    on_finish: str | None = None,
    result_file: str | None = None,
    try_number: int = 1,
) -> LocalStep | KubernetesStep:
    """The step of one try of ``plan``: a :class:`LocalStep` or a :class:`KubernetesStep`,
    picked from ``plan.target``. Nothing runs, and no cluster is read, until its ``run()``.

    Attach or create: the step is named from ``attempt``, so the same try opened again (its
    watcher died) finds its Jobs when it runs, and says so once in the step's log.

    Args:
        plan: the plan, built once (``torchstep.build_plan(app, "local" | "kubernetes")``).
        attempt: the orchestrator's identity of the try: an :class:`Attempt` (or the tuple of
            its parts: no try number), an exact run id, or ``None`` (a fresh id: ``torchstep
            run``). An :class:`Attempt` without a try number on Kubernetes attaches to the
            logical attempt's running or finished Jobs and starts afresh after a failed one
            (``KubernetesStep(logical_attempt=...)``).
        cfg: the target's cfg table (``torchstep runopts local|kubernetes``).
        client: the Kubernetes client (kubernetes only; default: kubeconfig or in-cluster).
        on_line: receives every line of the step (each rank's, torchstep's notes).
        cursor_store: the orchestrator's state between tries (kubernetes only; see
            :class:`KubernetesStep`).
        on_status: local only: receives each replica state change.
        app_id: local only: the exact app id (and run directory name).
        display: local only: where the lines go instead of ``on_line``.
        poll_interval: kubernetes only: seconds between status reads (default 2).
        on_finish: kubernetes only: ``delete`` (default), ``delete_succeeded`` or ``keep``.
        result_file: kubernetes only: where the agent writes the result in the container.
        try_number: which try of :func:`~torchstep.steps.run_tries` this is (the result's
            ``attempts``); 1 outside that loop.

    Returns:
        The step; ``run()`` blocks and returns the :class:`~torchstep.StepResult`.

    Raises:
        SpecError: a plan for another target (``kfp``: the KFP adapter runs its plan's step
            through ``local`` or ``kubernetes``), a bad attempt, an option of the other kind
            (named), or a bad option.

    Example::

        step = open_step(plan, attempt=Attempt(("prefect", flow_run, task_key)), on_line=logger.info)
        result = step.run()
    """
    given = as_attempt(attempt)
    local_only = {"on_status": on_status, "app_id": app_id, "display": display}
    kube_only = {"poll_interval": poll_interval, "on_finish": on_finish, "result_file": result_file}
    if plan.target == "local":  # nothing on this machine outlives the worker: nothing to attach to
        _refuse(kube_only, "local")
        return LocalStep(
            plan,
            run_id=run_id_of(given),
            cfg=cfg,
            on_line=on_line,
            on_status=on_status,
            app_id=app_id,
            display=display,
            try_number=try_number,
        )
    check_plan(plan, "kubernetes")
    _refuse(local_only, "kubernetes")
    logical = isinstance(given, Attempt) and given.try_number is None
    return KubernetesStep(
        plan,
        run_id=None if logical else run_id_of(given),
        logical_attempt=given.run_id if isinstance(given, Attempt) and logical else None,
        cfg=cfg,
        client=client,
        on_line=on_line,
        cursor_store=cursor_store,
        poll_interval=2.0 if poll_interval is None else poll_interval,
        on_finish=on_finish or "delete",
        result_file=result_file,
        try_number=try_number,
        say_attaching=True,
    )


def _refuse(options: Mapping[str, object], target: str) -> None:
    given = [name for name, value in options.items() if value is not None]
    if given:
        raise SpecError(
            given[0],
            target,
            f"{given[0]} is an option of the other step kind, not of {target}",
            fix=f"leave {given[0]} out for the {target} target",
        )
