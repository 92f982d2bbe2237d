"""The plan layer: an AppDef turned into a validated, normalised :class:`~torchstep.plan.model.StepPlan` for a target, and the
field-by-field translation table behind :func:`torchstep.explain`.

Modules, from the bottom up (nothing here imports a target, an adapter or torch):

- :mod:`~torchstep.plan.limits`, :mod:`~torchstep.plan.names`, :mod:`~torchstep.plan.macros`,
  :mod:`~torchstep.plan.cmdline`: sanity limits, every name and syntax rule, TorchX macros,
  reading a role's own ``torchrun`` command line;
- :mod:`~torchstep.plan.model`: the plan's dataclasses, data only;
- :mod:`~torchstep.plan.rules`: one module of plain functions per concern, each recording a
  decision per field;
- :mod:`~torchstep.plan.planner`: :func:`build_plan` / :func:`plan_decisions`;
- :mod:`~torchstep.plan.explain`: :func:`explain`; :mod:`~torchstep.plan.agent_command`: how a
  replica's agent starts;
  :mod:`~torchstep.plan.options`: the run options of every target.

Turning a component reference into the AppDef is one layer up, in :mod:`torchstep.components`.

The public names are exported here too (``from torchstep.plan import build_plan``), imported
on first use so that ``import torchstep.plan.names`` stays cheap (``explain`` is
``torchstep.explain``: here the name is its module's).

Example::

    >>> from torchstep.plan import build_plan
    >>> from torchstep.components import materialize
    >>> build_plan(materialize("utils.echo", []), "local").roles[0].name
    'echo'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.lazy import lazy_names

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchstep.plan.model import RetryOwner, RolePlan, StepPlan, StepRetry
    from torchstep.plan.planner import build_plan, plan_decisions

__all__ = ["RetryOwner", "RolePlan", "StepPlan", "StepRetry", "build_plan", "plan_decisions"]

_NAMES = {
    "build_plan": "torchstep.plan.planner",
    "plan_decisions": "torchstep.plan.planner",
    "RetryOwner": "torchstep.plan.model",
    "RolePlan": "torchstep.plan.model",
    "StepPlan": "torchstep.plan.model",
    "StepRetry": "torchstep.plan.model",
}
__getattr__ = lazy_names(__name__, "torchstep", _NAMES)
