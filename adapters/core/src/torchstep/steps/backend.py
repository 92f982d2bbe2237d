"""The :class:`StepBackend` protocol: what a step kind gives :func:`~torchstep.steps.open_step`
and :func:`~torchstep.steps.run_tries` (one try of a plan: run, cancel, notes, the result),
and the checks every kind makes of its arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from torchstep.errors import SpecError
from torchstep.plan.model import StepPlan

if TYPE_CHECKING:
    from torchstep.result import StepResult

__all__ = ["StepBackend", "check_plan", "with_run_id"]


@runtime_checkable
class StepBackend(Protocol):
    """One try of a plan on one target (:class:`~torchstep.steps.local.LocalStep`,
    :class:`~torchstep.steps.kubernetes.KubernetesStep`).

    Constructing one runs nothing and reads no cluster; ``run()`` does everything.
    """

    #: The plan this step runs (built once for its target).
    plan: StepPlan
    #: The last result (also after an interrupt stopped the step), else ``None``.
    result: StepResult | None
    #: Which try of :func:`~torchstep.steps.run_tries` this is (the result's ``attempts``).
    try_number: int

    def run(self) -> StepResult:
        """Run the try to its end.

        Returns:
            The step result.
        """
        ...

    def cancel(self) -> None:
        """Stop every process of the try (from any thread); ``run`` returns CANCELLED."""
        ...

    def say(self, text: str) -> None:
        """A note of torchstep's in the step's log.

        Args:
            text: the note, one line.
        """
        ...

    def record(self, result: StepResult) -> None:
        """Keep ``result``, decided outside :meth:`run` (cancelled while waiting to retry),
        where this kind keeps its results (the local run directory's ``result.json``).

        Args:
            result: the try's final result.
        """
        ...


def check_plan(plan: object, target: str) -> StepPlan:
    """``plan`` when it is a :class:`StepPlan` for ``target``.

    Args:
        plan: what the caller passed.
        target: the step kind's target.

    Returns:
        The plan.

    Raises:
        SpecError: anything else (an AppDef, a plan for another target), with the fix.
    """
    if not isinstance(plan, StepPlan) or plan.target != target:
        got = f"a plan for target {plan.target!r}" if isinstance(plan, StepPlan) else type(plan).__name__
        raise SpecError(
            "plan",
            target,
            f"a {target} step runs a plan for target {target!r}, got {got}",
            fix=f"torchstep.build_plan(app, {target!r}) once, and pass the plan",
        )
    return plan


def with_run_id(cfg: Mapping[str, Any] | None, run_id: str | None, target: str) -> dict[str, Any]:
    """A copy of ``cfg`` holding the orchestrator's ``run_id``.

    Args:
        cfg: the target's run options (the cfg table, ``torchstep runopts <target>``).
        run_id: the try's run id, or ``None``.
        target: the step kind's target (named in the error).

    Returns:
        The copy, ``run_id`` set when given.

    Raises:
        SpecError: ``cfg`` holds another run id (the orchestrator sets it, per try).
    """
    out = dict(cfg or {})
    if out.get("run_id") not in (None, run_id):
        raise SpecError("cfg['run_id']", target, "the run id is set by the orchestrator (per try)", fix="remove it")
    if run_id is not None:
        out["run_id"] = run_id
    return out
