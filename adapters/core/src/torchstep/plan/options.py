"""Run options of a target (``cfg``): one table per target, declared as TorchX ``runopts``
and checked the same way everywhere.

A table maps an option name to ``(type, default, help)``; ``type`` is one of ``bool``,
``int``, ``float``, ``str``, ``list`` (of strings) or ``dict`` (of strings). Values may be
typed or strings as a command line gives them: lists ``a;b``, dicts ``k:v;k2:v2``.

Example::

    >>> table = {"retries": (int, None, "retries of the whole app"), "tags": (list, None, "tags")}
    >>> parse_options({"retries": "2", "tags": "a;b"}, table, target="local")
    {'retries': 2, 'tags': ['a', 'b']}
    >>> parse_options({"nope": 1}, table, target="local")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg['nope'] (target 'local'): unknown option; fix: use one of: retries, tags
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchstep.errors import SpecError

OptionTable = Mapping[str, tuple[Any, Any, str]]

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


def to_runopts(table: OptionTable) -> Any:
    """``table`` as a ``torchx.specs.runopts`` (what ``torchstep runopts TARGET`` prints).

    Args:
        table: option name → ``(type, default, help)``.

    Returns:
        A ``torchx.specs.runopts``.
    """
    from typing import Dict, List  # noqa: UP035 - torchx's runopts wants typing generics

    from torchx.specs import runopts

    generic = {list: List[str], dict: Dict[str, str]}  # noqa: UP006
    opts = runopts()
    for name, (typ, default, help_) in table.items():
        opts.add(name, type_=generic.get(typ, typ), default=default, help=help_)
    return opts


def parse_options(
    cfg: Mapping[str, Any] | None, table: OptionTable, *, target: str | None, scheduler: str | None = None
) -> dict[str, Any]:
    """The options given in ``cfg``, converted to their types; ``None`` values are skipped.
    Unknown keys and bad values raise a :class:`~torchstep.SpecError` naming ``cfg['<key>']``;
    ``scheduler`` names the TorchX scheduler whose options they are (the fix then points
    at ``torchx runopts <scheduler>``).

    Args:
        cfg: option name → value (typed, or text as ``--cfg key=value`` gives it); ``None``: none.
        table: option name → ``(type, default, help)``.
        target: the SpecError's target.
        scheduler: the TorchX scheduler whose options they are; ``None``: a torchstep target's.

    Returns:
        Option name → converted value, for the options given (defaults are not filled in).

    Raises:
        SpecError: an unknown key or a value that cannot be converted.
    """
    out: dict[str, Any] = {}
    for key, value in dict(cfg or {}).items():
        path = f"cfg[{key!r}]"
        if key not in table:
            owner = f": not an option of the {scheduler} scheduler" if scheduler else ""
            where = f" (`torchx runopts {scheduler}`)" if scheduler else ""
            raise SpecError(path, target, f"unknown option{owner}", fix=f"use one of: {', '.join(table)}{where}")
        if value is not None:
            out[key] = convert(path, table[key][0], value, target=target, scheduler=scheduler)
    return out


def convert(path: str, typ: Any, value: Any, *, target: str | None, scheduler: str | None = None) -> Any:
    """``value`` as ``typ`` (see the module docstring).

    Args:
        path: the option's field path (``cfg['timeout']``).
        typ: ``str``, ``int``, ``float``, ``bool``, ``list`` or ``dict``.
        value: the value, typed or as text.
        target: the SpecError's target.
        scheduler: the TorchX scheduler, for the fix; ``None``: a torchstep target.

    Returns:
        The converted value.

    Raises:
        SpecError: ``value`` cannot be converted, naming ``path``.
    """
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
    elif typ is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif typ is str:
        if isinstance(value, str) and value and "\x00" not in value:
            return value
    elif typ is list:
        if isinstance(value, str):
            return [v.strip() for v in value.replace(",", ";").split(";") if v.strip()]
        if isinstance(value, list | tuple) and all(isinstance(v, str | int) for v in value):
            return [str(v) for v in value]
    elif typ is dict:
        if isinstance(value, str):
            pairs = [p for p in value.replace(",", ";").split(";") if p.strip()]
            if all(":" in p for p in pairs):
                return {k.strip(): v.strip() for k, _, v in (p.partition(":") for p in pairs)}
        elif isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
    kinds = {str: "a non-empty string", list: "a list of strings", dict: "a mapping of strings (key:value;key2:value2)"}
    kind = kinds.get(typ, f"a {getattr(typ, '__name__', typ)}")
    runopts = f"torchx runopts {scheduler}" if scheduler else f"torchstep runopts {target}"
    raise SpecError(path, target, f"must be {kind}, got {value!r}", fix=f"see `{runopts}`")
