"""``explain``: the field-by-field translation table of an AppDef on a target.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("utils.echo", ["--msg", "hi", "--image", "ghcr.io/acme/echo:1"])
    >>> print(torchstep.explain(app, target="kfp").splitlines()[0])
    torchstep explain: app 'echo' on target 'kfp' — OK
    >>> app = torchstep.materialize("utils.echo", ["--msg", "hi"])  # TorchX's image: no torchstep in it
    >>> print(torchstep.explain(app, target="kfp").splitlines()[0])
    torchstep explain: app 'echo' on target 'kfp' — 1 warning(s)
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from torchstep.plan.model import Decision
from torchstep.plan.planner import plan_decisions
from torchstep.plan.secrets import INLINED_INTO, inlined_secrets_note

ACTIONS = {"honoured": "yes", "warning": "WARNING", "ignored": "ignored", "rejected": "REJECTED"}


def explain(app: Any, target: str, *, width: int = 120) -> str:
    """A readable table, one row per field: its value and what it becomes on ``target``,
    or why it is ignored, rejected or will most likely fail there (a WARNING, with the fix).
    Never raises for a bad AppDef: the rejected fields are rows of the table, and the first
    line says how many fields were rejected or warned about (``OK`` when none).

    Args:
        app: the ``torchx.specs.AppDef``.
        target: ``local``, ``kubernetes`` or ``kfp``.
        width: the table's width in characters (long values are wrapped).

    Returns:
        The table as text, notes on secret-looking values below it.

    >>> import torchstep
    >>> from torchx.specs import AppDef, Role
    >>> text = explain(AppDef("x", [Role("r", image="", entrypoint="python")]), "kfp")
    >>> text.splitlines()[0]
    "torchstep explain: app 'x' on target 'kfp' — 1 field(s) rejected"
    >>> [line.split("|")[2].strip() for line in text.splitlines() if "roles[0].image " in line]
    ['REJECTED']
    """
    decisions = plan_decisions(app, target)
    name = getattr(app, "name", "?")
    return render_table(
        decisions,
        app_name=name if isinstance(name, str) else repr(name),
        target=target,
        width=width,
        notes=notes_of(app, target),
    )


def notes_of(app: Any, target: str) -> list[str]:
    """What :func:`explain` says below the table: secret-looking plain env values and where
    they end up on ``target``.

    Args:
        app: the ``torchx.specs.AppDef``.
        target: ``local``, ``kubernetes`` or ``kfp``.

    Returns:
        One line per note (empty when there is nothing to say).

    >>> from torchx.specs import AppDef, Role
    >>> notes_of(AppDef("x", [Role("r", image="i", entrypoint="e", env={"DB_PASSWORD": "p"})]), "kfp")[0][:60]
    "roles[0].env['DB_PASSWORD'] looks like a secret and is writt"
    """
    roles = getattr(app, "roles", None)
    where = (INLINED_INTO.get(target) if isinstance(target, str) else None) or "the AppDef wherever it travels"
    pairs = [(i, getattr(r, "env", None)) for i, r in enumerate(roles if isinstance(roles, list | tuple) else [])]
    note = inlined_secrets_note(pairs, where)
    return [note] if note else []


def render_table(
    decisions: list[Decision], *, app_name: str, target: str, width: int = 120, notes: Sequence[str] = ()
) -> str:
    """The table of :func:`explain` for decisions already made; ``notes`` follow it.

    Args:
        decisions: the rows (:func:`~torchstep.plan.planner.plan_decisions`).
        app_name: the AppDef's name, for the first line.
        target: the target, for the first line.
        width: the table's width in characters.
        notes: lines printed below the table.

    Returns:
        The table as text.
    """
    rejected = sum(d.action == "rejected" for d in decisions)
    warned = sum(d.action == "warning" for d in decisions)
    counts = []
    if rejected:
        counts.append(f"{rejected} field(s) rejected")
    if warned:
        counts.append(f"{warned} warning(s)")
    status = ", ".join(counts) or "OK"
    head = f"torchstep explain: app {_one_line(app_name)!r} on target {_one_line(str(target))!r} — {status}"
    fw = min(max((len(d.field) for d in decisions), default=5), 36)  # longer paths wrap
    # the value column widens for its longest word (an image reference), up to 32
    vw = min(max([24, *(len(w) for d in decisions for w in _one_line(d.value).split())]), 32)
    aw = 8
    bw = max(width - fw - vw - aw - 9, 30)
    lines = [head, "", f"{'field':<{fw}} | {'value':<{vw}} | {'honoured':<{aw}} | on {target}"]
    lines.append(f"{'-' * fw}-+-{'-' * vw}-+-{'-' * aw}-+-{'-' * bw}")
    for d in decisions:
        becomes = d.becomes + (f" — fix: {d.fix}" if d.fix else "")
        fcol = _wrap(d.field, fw)
        vcol = _wrap(d.value, vw)
        bcol = _wrap(becomes, bw)
        for i in range(max(len(fcol), len(vcol), len(bcol))):
            f = fcol[i] if i < len(fcol) else ""
            v = vcol[i] if i < len(vcol) else ""
            a = ACTIONS[d.action] if i == 0 else ""
            b = bcol[i] if i < len(bcol) else ""
            lines.append(f"{f:<{fw}} | {v:<{vw}} | {a:<{aw}} | {b}".rstrip())
    lines += [f"\nwarning: {_one_line(note)}" for note in notes]
    return "\n".join(lines) + "\n"


def _one_line(text: str) -> str:
    return text if text.isprintable() else repr(text)[1:-1]


def _wrap(text: str, width: int) -> list[str]:
    """``text`` in lines of at most ``width``, broken between words; a word longer than a
    line is broken after a ``/``, ``:``, ``,``, ``=``, ``.``, ``_`` or ``-`` where it has one, so a path or
    an image reference is never cut in the middle of a name.

    >>> _wrap("image ghcr.io/pytorch/torchx:0.7.0 is used", 24)
    ['image', 'ghcr.io/pytorch/torchx:', '0.7.0', 'is used']
    """
    # break_on_hyphens=False keeps paths and flags whole; control characters are escaped
    # so one field is one table cell whatever its value holds
    lines = textwrap.wrap(_one_line(text), width, break_on_hyphens=False, break_long_words=False, drop_whitespace=True)
    out: list[str] = []
    for line in lines:
        while len(line) > width:
            cut = max(line.rfind(c, 0, width) for c in "/:,=._-")
            cut = cut + 1 if cut > 0 else width
            out.append(line[:cut])
            line = line[cut:].lstrip()
        if line:
            out.append(line)
    return out or [""]
