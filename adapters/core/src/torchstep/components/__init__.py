"""Component loading: a component reference (a TorchX builtin such as ``dist.ddp``, a
``file.py:fn`` path, or a callable) and its arguments turned into a TorchX ``AppDef``, with
TorchX's own argument parsing — the first step of the data flow component → AppDef → plan →
target.

- :mod:`~torchstep.components.materialize`: :func:`~torchstep.components.materialize.materialize`,
  the component's parameters (``parameters_of``) and its static values;
- :mod:`~torchstep.components.cache`: resolving a component once per process (file
  modification times decide when it is read again);
- :mod:`~torchstep.components.plan_cache`: a materialized AppDef and its plan kept per
  component call;
- :mod:`~torchstep.components.appjson`: an AppDef as JSON data and back (how an AppDef
  travels to a generic DAG or flow).

Example::

    >>> from torchstep.components.materialize import materialize
    >>> materialize("utils.echo", ["--msg", "hi"]).roles[0].args
    ['hi']
"""
