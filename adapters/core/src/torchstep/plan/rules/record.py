"""The recording half of the rule book: every rule records one :class:`Decision` per
field (honoured / honoured with a warning / ignored / rejected) through :class:`Recorder`.

Example::

    >>> r = Recorder(app=None, target="kfp")
    >>> r.ignore("roles[0].resource.tags", {"team": "ml"}, "informational")
    >>> r.decisions[0].action
    'ignored'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from torchstep.plan.limits import MAX_SECONDS, SHOW_MAX
from torchstep.plan.model import Decision

#: What a field becomes on each target: ``{"local": ..., "kubernetes": ..., "kfp": ...}``,
#: each text a ``str.format`` template. Every rule module keeps its wording in one
#: ``BECOMES`` table of these, beside the rules that use it.
Wording = Mapping[str, str]


class Rejected(Exception):
    """Internal: stop planning a field group after a rejection was recorded."""


#: The role a field path belongs to (``roles[3]`` of ``roles[3].args[0]``).
_ROLE = re.compile(r"roles\[\d+\]")


def _role_of(path: str) -> str:
    """``roles[i]`` for a field of a role; ``""`` for any other field."""
    m = _ROLE.match(path)
    return m.group(0) if m else ""


class Recorder:
    """The target and the decisions recorded so far: the first argument of every rule
    function (``resources(rec, "roles[0]", role)``).

    Rejections are also kept by role, so that :meth:`rejected_under` looks only at the
    rejections of its own role: planning stays linear in the AppDef's size (scanning every
    decision made planning 1,000 roles take seconds, 10,000 minutes).
    """

    def __init__(self, app: Any, target: str) -> None:
        self.app = app
        self.target = target
        self.decisions: list[Decision] = []
        self._rejected: dict[str, list[str]] = {}  # role (``roles[i]`` or "") -> rejected field paths

    def on_target(self, wording: Wording, **fields: Any) -> str:
        """``wording``'s text for this target, formatted with ``fields``.

        Example::

            >>> Recorder(None, "kfp").on_target({"local": "x", "kubernetes": "y", "kfp": "set_retry({n})"}, n=2)
            'set_retry(2)'
        """
        return wording[self.target].format(**fields)

    def ok(self, path: str, value: Any, becomes: str) -> None:
        """Record ``path`` as honoured: ``becomes`` says what it turns into on the target."""
        self.decisions.append(Decision(path, show(value), "honoured", becomes))

    def ignore(self, path: str, value: Any, why: str) -> None:
        """Record ``path`` as ignored on the target, with the reason (a plan note)."""
        self.decisions.append(Decision(path, show(value), "ignored", why))

    def warn(self, path: str, value: Any, problem: str, fix: str) -> None:
        """Record ``path`` as honoured, with a warning: the step will most likely fail where it
        runs (``problem``) unless the user does ``fix``. ``build_plan`` keeps it in the plan's
        ``warnings``; ``explain`` and ``torchstep render`` show it."""
        self.decisions.append(Decision(path, show(value), "warning", problem, fix))

    def reject(self, path: str, value: Any, problem: str, fix: str) -> None:
        """Record ``path`` as rejected: ``build_plan`` raises a SpecError with ``fix``."""
        self.decisions.append(Decision(path, show(value), "rejected", problem, fix))
        self._rejected.setdefault(_role_of(path), []).append(path)

    def fail(self, path: str, value: Any, problem: str, fix: str) -> Rejected:
        """:meth:`reject`, and return an exception that ends the field group."""
        self.reject(path, value, problem, fix)
        return Rejected()

    @property
    def rejected(self) -> bool:
        return bool(self._rejected)

    def rejected_under(self, prefix: str) -> bool:
        """Whether ``prefix`` or a field below it (``prefix.x``, ``prefix[i]``) was rejected."""
        role = _role_of(prefix)
        # a prefix inside one role can only match that role's rejections; any other, all of them
        fields = self._rejected.get(role, []) if role else [f for fs in self._rejected.values() for f in fs]
        return any(f == prefix or f.startswith((prefix + ".", prefix + "[")) for f in fields)

    def seconds(self, path: str, value: Any) -> float | None:
        """A positive duration in seconds (a number or a numeric string), or ``None``
        after recording a rejection."""
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            self.reject(path, value, "must be a number of seconds", "e.g. 3600")
            return None
        try:
            s = float(value)
        except (ValueError, OverflowError):
            self.reject(path, value, "must be a number of seconds", "e.g. 3600")
            return None
        if not math.isfinite(s) or not 0 < s <= MAX_SECONDS:
            self.reject(path, value, f"must be a positive number of seconds (at most {MAX_SECONDS})", "e.g. 3600")
            return None
        return s


def is_int(value: Any) -> TypeGuard[int]:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def show(value: Any) -> str:
    """``value`` as one printable line of at most :data:`SHOW_MAX` characters."""
    try:
        text = value if isinstance(value, str) and value.isprintable() else repr(value)
    except Exception:  # a repr that raises must not break planning
        text = f"<{type(value).__name__}>"
    return text if len(text) <= SHOW_MAX else text[: SHOW_MAX - 3] + "..."
