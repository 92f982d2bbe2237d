"""TorchX macros as typed placeholders, and binding them at run time.

Binding follows TorchX exactly (``string.Template.safe_substitute``): ``${app_id}`` is
replaced, unknown ``${x}`` is left alone, and ``$$`` becomes ``$`` — TorchX's own
``dist.ddp`` relies on that (``$${${rank0_env}:=localhost}``).

Example::

    >>> from torchstep.macros import Macro, find_macros, substitute
    >>> sorted(m.value for m in find_macros(["--id", "${app_id}", "r${replica_id}"]))
    ['app_id', 'replica_id']
    >>> substitute("run-${app_id}-$${HOME}", {"app_id": "demo-1a2b"})
    'run-demo-1a2b-${HOME}'
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from string import Template


class Macro(str, enum.Enum):
    """The TorchX macros (``torchx.specs.macros``)."""

    APP_ID = "app_id"
    REPLICA_ID = "replica_id"
    IMG_ROOT = "img_root"
    BASE_IMG_ROOT = "base_img_root"
    RANK0_ENV = "rank0_env"

    @property
    def placeholder(self) -> str:
        return "${" + self.value + "}"


#: The environment variable that ``${rank0_env}`` names: it holds the host of the role's
#: replica 0 (TorchX's kubernetes scheduler uses the same name).
RANK0_ENV_VAR = "TORCHX_RANK0_HOST"


def find_macros(texts: Iterable[str]) -> frozenset[Macro]:
    """The macros used in ``texts``."""
    found: set[Macro] = set()
    for text in texts:
        if "$" not in text:
            continue
        for m in Macro:
            if m.placeholder in text or f"${m.value}" in text:
                found.add(m)
    return frozenset(found)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace macros in ``text`` the way TorchX does."""
    if "$" not in text:
        return text
    return Template(text).safe_substitute(values)
