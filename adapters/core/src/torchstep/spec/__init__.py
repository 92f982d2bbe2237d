"""The spec layer: an AppDef (or the TorchX component that makes one) turned into a
validated, normalised :class:`~torchstep.spec.model.StepPlan` for a target, and the
field-by-field translation table behind :func:`torchstep.explain`.

Modules, from the bottom up (nothing here imports a target, an adapter or torch):

- :mod:`~torchstep.spec.limits`, :mod:`~torchstep.spec.names`, :mod:`~torchstep.spec.macros`,
  :mod:`~torchstep.spec.cmdline`: sanity limits, every name and syntax rule, TorchX macros,
  reading a role's own ``torchrun`` command line;
- :mod:`~torchstep.spec.model`: the plan's dataclasses, data only;
- :mod:`~torchstep.spec.rules`: one module of plain functions per concern, each recording a
  decision per field;
- :mod:`~torchstep.spec.planner`: :func:`build_plan` / :func:`plan_decisions`;
- :mod:`~torchstep.spec.explain`: :func:`explain`; :mod:`~torchstep.spec.components`:
  :func:`materialize`; :mod:`~torchstep.spec.agent_command`: how a replica's agent starts;
  :mod:`~torchstep.spec.options`: the run options of every target.

Example::

    >>> from torchstep.spec.planner import build_plan
    >>> from torchstep.spec.components import materialize
    >>> build_plan(materialize("utils.echo", []), "local").roles[0].name
    'echo'
"""
