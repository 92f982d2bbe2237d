"""TorchX macros as typed placeholders, and binding them at run time.

Binding follows TorchX exactly (``string.Template.safe_substitute``, applied like
``torchx.specs.macros.Values.apply`` to every arg, every env value and every string nested
in the role's metadata — not to the entrypoint): ``${app_id}`` and ``$app_id`` are replaced,
unknown ``${x}`` is left alone, and ``$$`` becomes ``$`` — TorchX's own ``dist.ddp`` relies
on that (``$${${rank0_env}:=localhost}``). The plan keeps argv raw, byte for byte; binding
happens when a replica starts.

Example::

    >>> from torchstep.plan.macros import Macro, find_macros, substitute
    >>> sorted(m.value for m in find_macros(["--id", "${app_id}", "r$replica_id", "$${img_root}"]))
    ['app_id', 'replica_id']
    >>> substitute("run-${app_id}-$${HOME}", {"app_id": "demo-1a2b"})
    'run-demo-1a2b-${HOME}'
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Iterable, Iterator, Mapping
from string import Template
from typing import Any


class Macro(str, enum.Enum):
    """The TorchX macros (``torchx.specs.macros``)."""

    APP_ID = "app_id"
    REPLICA_ID = "replica_id"
    IMG_ROOT = "img_root"
    BASE_IMG_ROOT = "base_img_root"
    RANK0_ENV = "rank0_env"

    @property
    def placeholder(self) -> str:
        """``${name}``, as TorchX writes it.

        >>> Macro.APP_ID.placeholder
        '${app_id}'
        """
        return "${" + self.value + "}"


#: The environment variable that ``${rank0_env}`` names: it holds the host of the role's
#: replica 0 (TorchX's kubernetes scheduler uses the same name).
RANK0_ENV_VAR = "TORCHX_RANK0_HOST"

_BY_NAME = {m.value: m for m in Macro}


def find_macros(texts: Iterable[str]) -> frozenset[Macro]:
    """The macros that binding would replace in ``texts`` (parsed exactly as
    ``string.Template`` parses them, so ``$${app_id}`` — an escaped ``$`` — is not one).

    Args:
        texts: args, env values or any strings of a role.

    Returns:
        The macros used.
    """
    found: set[Macro] = set()
    for text in texts:
        if "$" not in text:
            continue
        for match in Template.pattern.finditer(text):
            name = match.group("named") or match.group("braced")
            if name in _BY_NAME:
                found.add(_BY_NAME[name])
    return frozenset(found)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace macros in ``text`` the way TorchX does (``string.Template.safe_substitute``:
    an unknown ``${name}`` stays as it is; ``$$`` becomes ``$``).

    Args:
        text: the string.
        values: macro name → value.

    Returns:
        The bound string.
    """
    if "$" not in text:
        return text
    return Template(text).safe_substitute(values)


def substitute_nested(obj: Any, values: Mapping[str, str]) -> Any:
    """A deep copy of ``obj`` (dicts and lists) with macros bound in every string, as
    TorchX binds role metadata.

    Args:
        obj: dicts, lists and scalars; only strings are bound.
        values: macro name → value.

    Returns:
        The bound copy.

    >>> substitute_nested({"labels": {"run": "${app_id}"}, "n": 1}, {"app_id": "a-1"})
    {'labels': {'run': 'a-1'}, 'n': 1}
    """
    if isinstance(obj, str):
        return substitute(obj, values)
    if isinstance(obj, dict):
        return {k: substitute_nested(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [substitute_nested(v, values) for v in obj]
    return copy.deepcopy(obj)


def nested_strings(obj: Any) -> Iterator[str]:
    """Every string nested in dicts and lists (what :func:`substitute_nested` binds).

    Args:
        obj: dicts, lists and scalars.

    Returns:
        The strings, depth first (dict keys are not included).
    """
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from nested_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from nested_strings(v)
