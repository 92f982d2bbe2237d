"""Deprecated alias of :mod:`torchstep.plan` and :mod:`torchstep.components` (the package was
named ``torchstep.spec`` until 0.2): ``import torchstep.spec.model`` still works for one
release and warns once. Import from the new paths:

- ``torchstep.spec.components`` → ``torchstep.components.materialize``
- ``torchstep.spec.component_cache`` → ``torchstep.components.cache``
- ``torchstep.spec.appjson`` / ``plan_cache`` → ``torchstep.components.appjson`` / ``plan_cache``
- every other ``torchstep.spec.X`` → ``torchstep.plan.X``
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

_MOVED = {
    "components": "torchstep.components.materialize",
    "component_cache": "torchstep.components.cache",
    "appjson": "torchstep.components.appjson",
    "plan_cache": "torchstep.components.plan_cache",
}


def new_name(old: str) -> str:
    """The module that replaced ``old`` (``torchstep.spec...``)."""
    rest = old.removeprefix("torchstep.spec").lstrip(".")
    head = rest.split(".", 1)[0]
    if head in _MOVED:
        return _MOVED[head] + rest[len(head) :]
    return "torchstep.plan" + (f".{rest}" if rest else "")


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``torchstep.spec.X`` with the module that replaced it (the same object)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("torchstep.spec."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(new_name(spec.name))

    def exec_module(self, module: ModuleType) -> None:
        return None


warnings.warn(
    "torchstep.spec was renamed: import torchstep.plan (AppDef -> plan) or torchstep.components "
    "(component -> AppDef); the alias goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)
if not any(isinstance(f, _Alias) for f in sys.meta_path):
    sys.meta_path.insert(0, _Alias())


def __getattr__(name: str) -> Any:
    return importlib.import_module(new_name(f"torchstep.spec.{name}"))
