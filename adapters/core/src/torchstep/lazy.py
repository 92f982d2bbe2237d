"""The lazy names of a package (stdlib only): what the adapters' ``__init__`` modules use
so that importing them stays free — each public name is imported from its module on first
use, ``__version__`` comes from the distribution's metadata (written once, in its
``pyproject.toml``), and a renamed name still works for a release, with a warning —
as does a moved module (:func:`moved_module`).

Example::

    # torchstep_kfp/__init__.py
    __getattr__ = lazy_names(__name__, "torchstep-kfp", {"apply_plan": "torchstep_kfp.tasks"})
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names", "moved_module"]


def lazy_names(
    package: str, dist: str, names: Mapping[str, str], renamed: Mapping[str, str] | None = None
) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``.

    Args:
        package: the package's ``__name__``.
        dist: its distribution, whose version ``__version__`` is.
        names: public name -> the module that defines it (imported on first use, then kept).
        renamed: old name -> new name: the old one works and warns (``DeprecationWarning``).

    Returns:
        The function to assign to the package's ``__getattr__``.

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
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name]), name)
        module = sys.modules.get(package)
        if module is not None:
            setattr(module, name, value)  # the next look-up finds it without coming here
        return value

    return __getattr__


def moved_module(old: str, new: str, since: str) -> None:
    """Make module ``old`` the module ``new`` (the same object: every name, isinstance
    checks included), warning once that it moved (``DeprecationWarning``).

    Args:
        old: the module being imported (its ``__name__``), now an alias.
        new: the module that replaced it.
        since: the release that moved it (the alias goes one release later).

    Example (the whole body of an old module)::

        # torchstep_airflow/torchx_scheduler.py
        moved_module(__name__, "torchstep.schedulers.airflow", since="0.3")
    """
    warnings.warn(f"{old} moved to {new} in {since}; import it from there", DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
