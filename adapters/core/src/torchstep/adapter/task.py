"""A step as an orchestrator's task, planned once: :class:`StepTask` holds a component
(a TorchX builtin name, ``"file.py:fn"``, ``"pkg.module:fn"``, a function) or an AppDef,
the target, the run options, and what every adapter derives from them when the task is
defined — the typed parameters of the task's signature, the plan made from their values
before run time, the retry map, the check of the user's own retries — and, per call, the
AppDef and plan of the call's values (the task's own plan when they are its values).

Importing this module is cheap: TorchX and the planner load when a task is made.

Example::

    >>> task = StepTask("utils.echo", target="local", defaults={"msg": "hi"})
    >>> task.name, task.plan.target, [(p.name, value) for p, value in task.parameters][:1]
    ('echo', 'local', [('msg', 'hi')])
    >>> task.call({"msg": "hi"})[1] is task.plan          # the values it was planned with
    True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torchstep.errors import RunError, SpecError

if TYPE_CHECKING:
    from torchstep.components.builders import ComponentParameter
    from torchstep.plan.model import StepPlan
    from torchstep.result import StepResult

__all__ = ["RUN_TARGETS", "StepFailed", "StepTask"]

#: The targets a step runs on (a compile target such as ``"kfp"`` plans, never runs).
RUN_TARGETS = ("local", "kubernetes")


class StepFailed(Exception):
    """A step ended unsuccessfully: ``result`` is its :class:`~torchstep.StepResult`,
    ``retryable`` whether another try can help (False after a
    ``torchstep.NonRetryableError``); the message is the step's failure summary.

    Args:
        result: the step result.
        message: the message; default: :func:`torchstep.steps.failure_summary` of ``result``.
    """

    def __init__(self, result: Any, message: str | None = None) -> None:
        if message is None:
            from torchstep.steps import failure_summary

            message = failure_summary(result)
        super().__init__(message)
        self.result = result
        retryable = result.get("retryable", True) if isinstance(result, Mapping) else result.retryable
        self.retryable = bool(retryable)


class StepTask:
    """A component or AppDef plus a target, planned once, when the task is defined.

    Args:
        app: an AppDef, a component function, or its reference (``"dist.ddp"``,
            ``"path/file.py:fn"``, ``"pkg.module:fn"``).
        target: where the step runs (``"local"``, ``"kubernetes"``), or a compile target
            (``"kfp"``) listed in ``targets``.
        cfg: the target's run options (``torchstep runopts local|kubernetes``), checked now.
        defaults: parameter name -> value known before run time (a component's own default
            otherwise): what the task's plan (retries, image, resources) is made from.
        targets: the targets the adapter offers (an unknown one is a SpecError naming them).
        builder: the adapter function the user called, named in errors' fixes.
        plan: the AppDef's plan for ``target`` when the caller made it already (an AppDef
            received from the network is checked and planned on arrival): not made again.

    Raises:
        SpecError: an unknown target, run option or parameter, a required parameter with no
            value, or an AppDef the target cannot run (naming the field).

    Example::

        task = StepTask("components/train.py:trainer", target="local", defaults={"lr": 0.1})
        fn = task.function(run_one_try)        # the orchestrator reads its typed signature
    """

    def __init__(
        self,
        app: Any,
        *,
        target: str = "local",
        cfg: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
        targets: Sequence[str] = RUN_TARGETS,
        builder: str = "StepTask",
        plan: StepPlan | None = None,
    ) -> None:
        from torchx.specs import AppDef

        from torchstep.cfg_table import check_cfg
        from torchstep.components.builders import component_of, static_values
        from torchstep.plan.planner import build_plan

        if target not in targets:
            raise SpecError("target", None, f"unknown target {target!r}", fix=f"use one of {list(targets)}")
        self.target = target
        self.cfg: dict[str, Any] = check_cfg(cfg, target) if target in RUN_TARGETS else dict(cfg or {})
        self.component = app
        self.function_: Callable[..., Any] | None = None
        if isinstance(app, AppDef):
            if defaults:
                raise SpecError(
                    "defaults",
                    target,
                    "values were given with a ready AppDef",
                    fix="pass the component function instead, or no defaults",
                )
            self.parameters: list[tuple[ComponentParameter, Any]] = []
            self.app = app
            self.name: str = app.name
        else:
            self.parameters, self.app = static_values(app, defaults, target=target, builder=builder)
            self.function_ = component_of(app)[0]
            self.name = getattr(self.function_, "__name__", None) or self.app.name
        if plan is not None and (plan.target != target or self.parameters):
            raise SpecError(
                "plan",
                target,
                f"a plan for target {plan.target!r} was given with a component for {target!r}",
                fix="pass the plan of the AppDef itself, for the same target",
            )
        self.plan: StepPlan = plan if plan is not None else build_plan(self.app, target)

    # -- the task's signature -------------------------------------------------------------------
    @property
    def values(self) -> dict[str, Any]:
        """The parameters' values the task was planned with (``None`` and ``[]`` left out)."""
        return {p.name: v for p, v in self.parameters if v is not None and v != []}

    def signature(self) -> list[inspect.Parameter]:
        """The task function's keyword parameters: the component's, typed, with the values
        the task was planned with as defaults (what KFP's and Prefect's schemas read)."""
        return [p.keyword(value) for p, value in self.parameters]

    def function(
        self, body: Callable[..., Any], *, returns: Any = dict, module: str | None = None
    ) -> Callable[..., Any]:
        """``body`` (taking the call's values as keywords) made the orchestrator's task
        function: :meth:`signature` as its signature, the task's name, the component's
        docstring.

        Args:
            body: the function one try runs; changed in place.
            returns: its return annotation.
            module: its ``__module__`` (default: the component's).

        Returns:
            ``body``.
        """
        from torchstep.components.builders import task_function

        fn = self.function_
        doc = (inspect.getdoc(fn) if fn is not None else None) or f"torchstep step {self.name}"
        module = module or getattr(fn, "__module__", None) or body.__module__
        return task_function(body, self.signature(), name=self.name, doc=doc, returns=returns, module=module)

    # -- one call -------------------------------------------------------------------------------
    def call(self, values: Mapping[str, Any] | None = None, *, target: str | None = None) -> tuple[Any, StepPlan]:
        """The AppDef and plan of one call of the task with ``values``: the task's own when
        the values are the ones it was planned with (or it is an AppDef), else the component
        materialised from them and planned once.

        Args:
            values: the call's parameter values; one left out, ``None`` or ``[]`` is the
                task's (its signature's default).
            target: the target of this call's plan (default: the task's).

        Returns:
            ``(app, plan)``.

        Raises:
            SpecError: the values make no AppDef, or one the target cannot run.
        """
        from torchstep.components.builders import materialize
        from torchstep.plan.planner import build_plan

        target = target or self.target
        given = {**self.values, **{k: v for k, v in (values or {}).items() if v is not None and v != []}}
        if not self.parameters or given == self.values:
            return self.app, self.plan if target == self.target else build_plan(self.app, target)
        app = materialize(self.component, given)
        return app, build_plan(app, target)

    # -- retries --------------------------------------------------------------------------------
    @property
    def retries(self) -> int:
        """The orchestrator's retries of the whole step (the plan's APPLICATION budget; 0
        when the agent or nobody retries)."""
        return self.plan.step_retry.count

    def delays(self, first: float = 0.0) -> list[float]:
        """The wait before each orchestrator retry, in seconds (the AppDef's retry timing).

        Args:
            first: the first delay when the AppDef sets none.

        Returns:
            One delay per retry (``retries`` of them), never negative.
        """
        return [max(0.0, d) for d in self.plan.step_retry.delays(first)]

    def check_user_retries(self, *, orchestrator: str, **settings: float | None) -> None:
        """A SpecError when the user's own retries or timeout on the task would add a
        second retry layer or contradict the AppDef (the same message everywhere).

        Args:
            orchestrator: its name in the message (``"Prefect"``).
            settings: ``retries``, ``timeout``, ``retry_delay``, ``retry_backoff``,
                ``max_retry_delay`` as the user set them (``None``: not set).

        Raises:
            SpecError: naming the setting and the AppDef's value.
        """
        from torchstep.steps import check_user_retries

        check_user_retries(self.plan, orchestrator=orchestrator, **settings)  # type: ignore[arg-type]

    @staticmethod
    def retryable(error: BaseException) -> bool:
        """Whether the orchestrator should retry after ``error``: not after a step that
        failed non-retryably (:class:`StepFailed`) nor a :class:`~torchstep.RunError` that
        says retrying cannot help; after anything else, yes.

        Args:
            error: what the try raised.

        Returns:
            True when another try may help.
        """
        return not (isinstance(error, StepFailed | RunError) and not error.retryable)

    def failed(self, result: StepResult) -> StepFailed:
        """The exception a try raises for an unsuccessful ``result``.

        Args:
            result: the step result.

        Returns:
            A :class:`StepFailed` carrying it.
        """
        return StepFailed(result)
