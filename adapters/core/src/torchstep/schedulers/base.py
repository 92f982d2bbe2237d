"""What every torchstep TorchX scheduler shares: AppDef validation against the target that
will run it (a :class:`~torchstep.SpecError` naming the field, before anything is
submitted), the AppDef as JSON for the orchestrator's run parameters, state mapping to
TorchX ``AppState``, log-line helpers and a follow loop for ``torchx log -f``.

Example::

    >>> from torchx import specs
    >>> app = specs.AppDef("a", roles=[specs.Role("w", image="", entrypoint="echo", args=["hi"])])
    >>> app_payload(app, "local")["roles"][0]["args"]
    ['hi']
    >>> app_state("SUCCEEDED").name, app_state("nonsense").name
    ('SUCCEEDED', 'UNKNOWN')
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from torchx.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream
from torchx.specs import AppDef, AppState

from torchstep.errors import SpecError
from torchstep.plan.names import short_id

#: How often a following ``log_iter`` / a waiting caller polls the orchestrator.
POLL_INTERVAL_S = 1.0


def app_payload(app: AppDef, target: str) -> dict[str, Any]:
    """``app`` as JSON data (:func:`torchstep.components.appjson.app_to_dict`), after checking it
    builds a plan for ``target``: the orchestrator checks it again on arrival."""
    from torchstep.components.appjson import app_to_dict
    from torchstep.plan.planner import build_plan

    build_plan(app, target)
    return app_to_dict(app)


def new_app_id(name: str) -> str:
    """``<name>-<6 chars>``: a DNS-label-safe, unique id for one submission."""
    from torchstep.plan.names import dns_label

    return f"{dns_label(name, max_len=50)}-{short_id(6)}"


def app_state(name: str | None) -> AppState:
    """A TorchX ``AppState`` by name (``UNKNOWN`` for anything else)."""
    return AppState[name] if name and name in AppState.__members__ else AppState.UNKNOWN


def response(app_id: str, state: AppState, msg: str = "", *, ui_url: str | None = None) -> DescribeAppResponse:
    """A ``DescribeAppResponse`` with the fields our schedulers fill."""
    resp = DescribeAppResponse()
    resp.app_id, resp.state, resp.msg, resp.ui_url = app_id, state, msg, ui_url
    return resp


def roles_of(app: Any) -> list[Any]:
    """The roles of a recorded AppDef (JSON data), for ``DescribeAppResponse.roles``: what
    ``torchx log`` checks a role name against. Unreadable data gives no roles."""
    from torchstep.components.appjson import app_from_dict

    try:
        return list(app_from_dict(app).roles)
    except ValueError:
        return []


#: How a rank's line starts (``[role/rank] ...``, the agent's prefix) and how the launcher
#: names a replica in its events (``torchstep: role/replica STATE``).
_RANK_PREFIX = re.compile(r"\[([^/\]\s]+)/\d+\]")
_EVENT = re.compile(r"torchstep: ([^/\s]+)/\d+ ")


def role_of_line(line: str, roles: list[str]) -> str | None:
    """The role a line of a step's one combined log belongs to (a rank's ``[role/rank]``
    line, a launcher event about ``role/replica``), or ``None`` for the orchestrator's own.

    >>> role_of_line("[trainer/3] loss 0.1", ["trainer", "ps"]), role_of_line("Task failed", ["trainer"])
    ('trainer', None)
    """
    m = _RANK_PREFIX.match(line) or _EVENT.search(line)
    return m[1] if m and m[1] in roles else None


def lines_of_role(lines: Iterable[str], role: str, roles: list[str]) -> Iterator[str]:
    """The lines of ``role`` in an orchestrator's one log of the whole step (Airflow's task
    log, Prefect's flow-run log); the orchestrator's own lines go with the first role, so
    ``torchx log`` over every role shows each line once."""
    first = not roles or role == roles[0]
    for line in lines:
        owner = role_of_line(line, roles)
        if owner == role or (owner is None and first):
            yield line


def check_endpoint(url: str, field: str, target: str | None, *, fix: str) -> str:
    """``url`` without its trailing ``/``; a SpecError naming ``field`` unless it is an
    http(s) URL with a host and without credentials, query or fragment — a record or a dry
    run must never hold a password (the URL itself is then not repeated either)."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.username or parts.password or parts.query or parts.fragment:
        raise SpecError(
            field, target, "must be an http(s) URL with no credentials, query or fragment (a URL with credentials, "
            "not shown)", fix=fix,
        )  # fmt: skip
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise SpecError(field, target, f"{url!r} is not an http(s) URL", fix=fix)
    return url.rstrip("/")


def check_stream(streams: Stream | None, scheduler: str) -> None:
    """Our logs interleave stdout and stderr as they were written: only ``combined``."""
    if streams not in (None, Stream.COMBINED):
        raise ValueError(
            f"{scheduler}: logs are stdout and stderr combined, in the order they were written; "
            "fix: drop --streams (or use --streams combined)"
        )


def select_lines(lines: Iterable[str], regex: str | None) -> Iterator[str]:
    """Lines (each ending in ``\\n``) that match ``regex`` (all when ``None``)."""
    pattern = re.compile(regex) if regex else None
    for line in lines:
        if not line.endswith("\n"):
            line += "\n"
        if pattern is None or pattern.search(line):
            yield line


def follow(
    fetch: Callable[[int, bool], tuple[list[str], int]],
    finished: Callable[[], bool],
    *,
    tail: bool,
    poll_s: float = POLL_INTERVAL_S,
    until: datetime | None = None,
) -> Iterator[str]:
    """Lines from ``fetch(cursor, final) -> (new lines, new cursor)``; with ``tail``, keep
    polling until ``finished()`` and then read once more (``final``: a last line without its
    newline too), so no line written before the end is lost."""
    cursor = 0
    while True:
        done = finished() if tail else True
        lines, cursor = fetch(cursor, done)
        yield from lines
        if done or (until is not None and datetime.now() >= until):
            return
        time.sleep(poll_s)


class TorchstepScheduler(Scheduler[Mapping[str, Any]]):
    """The base of our TorchX schedulers. TorchX's own pre-check (a resource on every role)
    is not ours to impose — the local target runs without one — and the target that will
    run the AppDef is only known from ``cfg``: ``_submit_dryrun`` checks the AppDef with
    :func:`app_payload` instead, so a bad AppDef is a SpecError naming the field."""

    #: Errors that mean "this orchestrator cannot be reached now": ``list`` skips such an app.
    unreachable: tuple[type[Exception], ...] = ()

    def _validate(self, app: AppDef, scheduler: str) -> None:
        return None

    def finished(self, app_id: str) -> bool:
        """Whether ``app_id`` is gone or in a final state (ends a following ``log_iter``)."""
        from torchx.specs.api import is_terminal

        desc = self.describe(app_id)
        return desc is None or is_terminal(desc.state)

    def list(self) -> list[ListAppResponse]:
        """The apps this user submitted from this machine (the private records), with their
        state; one whose orchestrator cannot be reached now is left out, the rest listed."""
        from torchstep.schedulers import records

        out = []
        for app_id in records.app_ids(self.backend):
            try:
                desc = self.describe(app_id)
            except self.unreachable:
                continue
            if desc is not None:
                out.append(ListAppResponse(app_id=app_id, state=desc.state))
        return out
