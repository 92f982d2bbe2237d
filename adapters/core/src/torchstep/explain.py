"""``explain``: the field-by-field translation table of an AppDef on a target.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("utils.echo", ["--msg", "hi"])
    >>> print(torchstep.explain(app, target="kfp").splitlines()[0])
    torchstep explain: app 'echo' on target 'kfp' — OK
"""

from __future__ import annotations

import textwrap
from typing import Any

from torchstep.plan import Decision, plan_decisions

ACTIONS = {"honoured": "yes", "ignored": "ignored", "rejected": "REJECTED"}


def explain(app: Any, target: str, *, width: int = 120) -> str:
    """A readable table, one row per field: its value and what it becomes on ``target``,
    or why it is ignored or rejected (with the fix). Never raises for a bad AppDef: the
    rejected fields are rows of the table.
    """
    decisions = plan_decisions(app, target)
    return render_table(decisions, app_name=getattr(app, "name", "?"), target=target, width=width)


def render_table(decisions: list[Decision], *, app_name: str, target: str, width: int = 120) -> str:
    rejected = [d for d in decisions if d.action == "rejected"]
    status = "OK" if not rejected else f"{len(rejected)} field(s) rejected"
    head = f"torchstep explain: app {app_name!r} on target {target!r} — {status}"
    fw = min(max((len(d.field) for d in decisions), default=5), 44)
    vw = 30
    aw = 8
    bw = max(width - fw - vw - aw - 9, 30)
    lines = [head, "", f"{'field':<{fw}} | {'value':<{vw}} | {'honoured':<{aw}} | on {target}"]
    lines.append(f"{'-' * fw}-+-{'-' * vw}-+-{'-' * aw}-+-{'-' * bw}")
    for d in decisions:
        becomes = d.becomes + (f" — fix: {d.fix}" if d.fix else "")
        fcol = textwrap.wrap(d.field, fw) or [""]
        vcol = textwrap.wrap(d.value.replace("\n", "\\n"), vw) or [""]
        bcol = textwrap.wrap(becomes, bw) or [""]
        for i in range(max(len(fcol), len(vcol), len(bcol))):
            f = fcol[i] if i < len(fcol) else ""
            v = vcol[i] if i < len(vcol) else ""
            a = ACTIONS[d.action] if i == 0 else ""
            b = bcol[i] if i < len(bcol) else ""
            lines.append(f"{f:<{fw}} | {v:<{vw}} | {a:<{aw}} | {b}".rstrip())
    return "\n".join(lines) + "\n"
