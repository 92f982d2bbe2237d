"""Plans remembered per process for DAG files that build many tasks of one component
(:func:`materialize_and_plan`): the Airflow dag-processor re-parses every DAG file in a
fresh fork, and 50 identical ``AppDefOperator`` s should cost one plan, not 50.

Example::

    >>> app, plan = materialize_and_plan("utils.echo", ["--msg", "hi"], "local")
    >>> app.roles[0].args, plan.roles[0].name
    (['hi'], 'echo')
"""

from __future__ import annotations

import os
import types
from collections.abc import Mapping, Sequence
from typing import Any

from torchstep.components import cache as component_cache
from torchstep.components.builders import component_of, materialize, materialize_resolved

#: Most (component, arguments, target) plans :func:`materialize_and_plan` keeps per process.
MAX_PLANS = 512

_plans: component_cache.LRU[tuple[Any, ...], tuple[bytes, bytes, tuple[str, ...], tuple[bool, ...]]] = (
    component_cache.LRU(MAX_PLANS)
)
_seen: component_cache.LRU[tuple[Any, ...], bool] = component_cache.LRU(MAX_PLANS)


class _NotAKey(Exception):
    pass


def _frozen(value: Any) -> Any:
    """A hashable stand-in of ``value`` that tells apart every value rendering differently
    (``1``, ``1.0``, ``True``, ``"1"``, ``-0.0``); :class:`_NotAKey` for anything else."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return (kind, value)
    if kind is float:
        return (kind, repr(value))
    if kind is list or kind is tuple:
        return (kind, tuple(_frozen(v) for v in value))
    if kind is dict:
        return (kind, tuple((_frozen(k), _frozen(v)) for k, v in value.items()))
    raise _NotAKey


def materialize_and_plan(
    component: Any, args: Sequence[str] | Mapping[str, Any] | None, target: str
) -> tuple[Any, Any]:
    """``(materialize(component, args), build_plan(app, target))``, remembered per process.

    For a DAG file that builds many tasks of one component: an identical (component
    function, arguments, target) is materialised and planned once; every call returns a
    fresh AppDef and plan (copies), so callers may change them. The key is the resolved
    component function — a new version of a component file is a new function — the
    arguments by value and type, the target, the working directory, and whether each
    role's image is a directory (the local target resolves both). Failures are not
    remembered: each raises the same :class:`~torchstep.SpecError` as the uncached path.

    Args:
        component: a component function, its reference, or an AppDef.
        args: the component's arguments (command-line strings or a mapping).
        target: the plan's target.

    Returns:
        ``(app, plan)``: fresh copies.

    Raises:
        SpecError: the arguments make no AppDef, or one the target cannot run.
    """
    import pickle

    from torchx.specs import AppDef

    from torchstep.plan.planner import build_plan

    if isinstance(component, AppDef):
        app = materialize(component, args)
        return app, build_plan(app, target)
    fn, label = component_of(component)
    key: tuple[Any, ...] | None = None
    if isinstance(fn, types.FunctionType):
        try:
            key = (fn, _frozen(args if not isinstance(args, Mapping) else dict(args)), target, os.getcwd())
        except (_NotAKey, OSError):  # a value we cannot key on, or no working directory
            key = None
    if key is not None:
        hit = _plans.get(key)
        if hit is not None:
            app_data, plan_data, images, dirs = hit
            if tuple(os.path.isdir(i) for i in images) == dirs:
                return pickle.loads(app_data), pickle.loads(plan_data)
        elif _seen.get(key) is None:  # copies are kept from the second identical call on: a
            _seen.put(key, True)  # DAG whose tasks all differ does not pay for them
            key = None
    app = materialize_resolved(fn, label, args, {})
    plan = build_plan(app, target)
    if key is not None:
        images = tuple(str(role.image) for role in app.roles)
        try:
            entry = (pickle.dumps(app, -1), pickle.dumps(plan, -1), images, tuple(os.path.isdir(i) for i in images))
        except Exception:  # something in the AppDef cannot be copied: no cache for it
            return app, plan
        _plans.put(key, entry)
    return app, plan
