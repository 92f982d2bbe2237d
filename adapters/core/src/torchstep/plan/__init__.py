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

Example::

    >>> from torchstep.plan.planner import build_plan
    >>> from torchstep.components.materialize import materialize
    >>> build_plan(materialize("utils.echo", []), "local").roles[0].name
    'echo'
"""
