"""Component loading: a component reference (a TorchX builtin such as ``dist.ddp``, a
``file.py:fn`` path, or a callable) and its arguments turned into a TorchX ``AppDef``, with
TorchX's own argument parsing — the first step of the data flow component → AppDef → plan →
target.

- :mod:`~torchstep.components.builders`: :func:`~torchstep.components.builders.materialize`,
  the component's parameters (``parameters_of``) and its static values;
- :mod:`~torchstep.components.cache`: resolving a component once per process (file
  modification times decide when it is read again);
- :mod:`~torchstep.components.plan_cache`: a materialized AppDef and its plan kept per
  component call;
- :mod:`~torchstep.components.appjson`: an AppDef as JSON data and back (how an AppDef
  travels to a generic DAG or flow).

The public names are exported here too (``from torchstep.components import materialize``),
imported on first use (TorchX loads with them); no submodule shares a name with one.

Example::

    >>> from torchstep.components import materialize
    >>> materialize("utils.echo", ["--msg", "hi"]).roles[0].args
    ['hi']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.lazy import lazy_names

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchstep.components.appjson import app_from_dict, app_to_dict
    from torchstep.components.builders import ComponentParameter, materialize, parameters_of

__all__ = ["ComponentParameter", "app_from_dict", "app_to_dict", "materialize", "parameters_of"]

_NAMES = {
    "materialize": "torchstep.components.builders",
    "parameters_of": "torchstep.components.builders",
    "ComponentParameter": "torchstep.components.builders",
    "app_to_dict": "torchstep.components.appjson",
    "app_from_dict": "torchstep.components.appjson",
}
__getattr__ = lazy_names(__name__, "torchstep", _NAMES)
