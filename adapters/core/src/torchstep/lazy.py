"""The one lazy-import helper (stdlib only): the ``__getattr__`` of every package that
exports names it must not import up front — ``torchstep`` itself (the Airflow scheduler
re-parses DAG files that import it every 30 s), its ``plan``, ``components`` and ``agent``
packages, and the adapters' ``__init__`` modules. Each public name is imported from its
module on first use; ``__version__`` comes from the distribution's metadata (written once,
in its ``pyproject.toml``).

Example::

    # torchstep_kfp/__init__.py
    __getattr__ = lazy_names(__name__, "torchstep-kfp", {"apply_plan": "torchstep_kfp.tasks"})
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Collection, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str,
    dist: str,
    names: Mapping[str, str],
    renamed: Mapping[str, str] | None = None,
    *,
    submodules: Collection[str] = (),
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``.

    Args:
        package: the package's ``__name__``.
        dist: its distribution, whose version ``__version__`` is.
        names: public name -> the module that defines it (imported on first use, then kept).
        renamed: old name -> new name: the old one works and warns (``DeprecationWarning``).
        submodules: submodules that ``package.<name>`` imports on first use.

    Returns:
        The function to assign to the package's ``__getattr__``; for any other name it
        raises ``AttributeError``.

    >>> getattr_ = lazy_names("pkg", "torchstep", {"dumps": "json"}, {"to_json": "dumps"})
    >>> getattr_("dumps") is __import__("json").dumps
    True
    """

    def __getattr__(name: str) -> Any:
        if name == "__version__":
            from importlib.metadata import version

            return version(dist)
        if renamed and name in renamed:
            warnings.warn(f"{package}.{name} is now {renamed[name]}", DeprecationWarning, stacklevel=2)
            name = renamed[name]
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = sys.modules.get(package)
        if module is not None:
            setattr(module, name, value)  # the next look-up finds it without coming here
        return value

    return __getattr__
