"""Every exported callable documents its parameters in an ``Args:`` section (issue 25 §4).

The API reference is generated from the docstrings (mkdocstrings, Google style), so a
parameter missing from ``Args:`` is a parameter missing from the reference.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import re
from typing import Any

import pytest

#: The packages whose ``__all__`` is the public API the reference documents.
PUBLIC_MODULES = ("torchstep", "torchstep.adapter", "torchstep.kubernetes", "torchstep.steps", "torchstep.policy")
#: The adapters' packages: checked where installed (the core-only wheel test has none).
ADAPTER_MODULES = ("torchstep_airflow", "torchstep_kfp", "torchstep_prefect")


def _parameters(obj: Any) -> list[str]:
    """The named parameters a caller passes (not ``self``/``cls``, not ``*args``/``**kwargs``)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature
        return []
    return [
        p.name
        for p in sig.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]


def _docstrings(obj: Any) -> list[str]:
    """The docstrings that may hold the ``Args:`` section: a class's own and its ``__init__``'s."""
    docs = [inspect.getdoc(obj) or ""]
    if inspect.isclass(obj):
        init = obj.__dict__.get("__init__")
        if init is not None and init.__doc__:
            docs.append(inspect.getdoc(init) or "")
    return docs


def args_section(doc: str) -> list[str] | None:
    """The parameter names listed in ``doc``'s ``Args:`` section (``None``: no section).

    >>> args_section("Run it.\\n\\nArgs:\\n    a: one.\\n        more on a.\\n    b (int): two.\\n\\nReturns:\\n    x")
    ['a', 'b']
    """
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "Args:":
            indent = len(line) - len(line.lstrip())
            names = []
            for entry in lines[i + 1 :]:
                if entry.strip() and len(entry) - len(entry.lstrip()) <= indent:
                    break  # the next section
                m = re.match(rf"^\s{{{indent + 1},}}\**(\w+)\s*(\([^)]*\))?:", entry)
                if m:
                    names.append(m.group(1))
            return names
    return None


def _exported() -> list[tuple[str, str, Any]]:
    out = []
    for module in PUBLIC_MODULES + ADAPTER_MODULES:
        try:  # an adapter's names load lazily: its orchestrator's import is in getattr
            mod = importlib.import_module(module)
            objects = [(name, getattr(mod, name)) for name in mod.__all__]
        except ImportError:
            if module in ADAPTER_MODULES:
                continue  # not installed (the core-only wheel test)
            raise
        for name, obj in objects:
            if inspect.isclass(obj) and issubclass(obj, enum.Enum):
                continue  # members, not parameters
            if inspect.isfunction(obj) or inspect.isclass(obj):
                out.append((module, name, obj))
    return out


EXPORTED = _exported()


def test_the_public_api_is_found() -> None:
    names = {f"{m}.{n}" for m, n, _ in EXPORTED}
    assert {"torchstep.build_plan", "torchstep.steps.open_step", "torchstep.policy.Policy"} <= names
    assert len(EXPORTED) > 30


@pytest.mark.parametrize(("module", "name", "obj"), EXPORTED, ids=[f"{m}.{n}" for m, n, _ in EXPORTED])
def test_exported_callable_documents_every_parameter(module: str, name: str, obj: Any) -> None:
    params = _parameters(obj)
    if not params:
        return
    sections = [s for s in (args_section(d) for d in _docstrings(obj)) if s is not None]
    assert sections, f"{module}.{name} takes {params} but its docstring has no Args: section"
    listed = {n for s in sections for n in s}
    missing = [p for p in params if p not in listed]
    assert not missing, f"{module}.{name}: the Args: section does not name {missing}"


def test_args_section_reader() -> None:
    doc = "Do it.\n\nArgs:\n    plan: the plan.\n    *args: more.\n    **kwargs: keywords.\n\nReturns:\n    x: not a parameter.\n"
    assert args_section(doc) == ["plan", "args", "kwargs"]
    assert args_section("No sections.") is None
