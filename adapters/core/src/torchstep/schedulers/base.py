"""The chassis of every torchstep TorchX scheduler: what ``torchstep_local``, ``airflow``,
``prefect`` and ``kfp`` share, so that a scheduler module holds only what differs by backend.

Every scheduler module has the same skeleton, in this order (as TorchX's own schedulers):
its options (one table ``OPTIONS`` → :func:`parse` → a frozen options dataclass → ``runopts``),
the request its dry run shows, its client of the orchestrator, the scheduler class (a
:class:`TorchstepScheduler`) and ``create_scheduler``. This module holds:

* :class:`SchedulerError`, the one error of a scheduler that could not do what was asked of
  the orchestrator (unreachable, refused, not deployed); bad input is a
  :class:`~torchstep.SpecError` naming the option, raised by the dry run before anything is
  sent;
* the option rules: :func:`parse`, :func:`check_endpoint`, the one rule for the *name* of a
  credential variable (:func:`check_secret_var`, never the value, never repeated), the
  namespace and target checks (DNS rules of :mod:`torchstep.plan.names`), and
  :func:`secret`, the one place a credential is read from the variable an option names;
* the AppDef as JSON data, the state mapping, the log helpers and the base class.

Beside it, :mod:`torchstep.schedulers.rest` holds the small REST client of the Airflow and
Prefect schedulers (KFP's uses ``kfp.Client``), which retries idempotent calls as Prefect's
own client does, and :mod:`torchstep.schedulers.generic` what those two send their
orchestrator's generic step and what that step checks on arrival.

Example::

    >>> from torchx import specs
    >>> app = specs.AppDef("a", roles=[specs.Role("w", image="", entrypoint="echo", args=["hi"])])
    >>> app_payload(app, "local")["roles"][0]["args"]
    ['hi']
    >>> app_state("SUCCEEDED").name, app_state("nonsense").name
    ('SUCCEEDED', 'UNKNOWN')
    >>> check_secret_var({"token_env": "ghp_0123abcd"}, "token_env", default=None, target=None)
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg['token_env']: must be the NAME of an environment variable ...
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, ClassVar

from torchx.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream
from torchx.specs import AppDef, AppState, ReplicaStatus, RoleStatus, runopts

from torchstep.errors import SpecError
from torchstep.plan.limits import MAX_SECONDS
from torchstep.plan.names import is_dns_label, short_id
from torchstep.plan.options import OptionTable, parse_options, to_runopts
from torchstep.result import TORCHX_STATES
from torchstep.schedulers.rules import SECRET_VAR, url_problem

#: How often a following ``log_iter`` / a waiting caller polls the orchestrator.
POLL_INTERVAL_S = 1.0
#: Where an orchestrator scheduler runs the step (the generic DAG's and flow's ``target``).
STEP_TARGETS = ("local", "kubernetes")


class SchedulerError(RuntimeError):
    """A torchstep TorchX scheduler could not do what was asked of the orchestrator: it is
    unreachable, refused the credentials or the request, or lacks what the submission needs
    (the generic DAG, a deployment). One line: the scheduler, what failed, and the fix.

    ``status`` is the HTTP status of the answer that failed, if any.

    Example::

        >>> err = SchedulerError("prefect: POST /flow_runs/filter: HTTP 500: boom", status=500)
        >>> err.status, isinstance(err, RuntimeError)
        (500, True)
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def one_line_errors_under_torchx_cli() -> None:
    """Under TorchX's own command line (``torchx run -s kfp ...``: its ``torchx.cli.main``
    is loaded), a :class:`~torchstep.SpecError` or :class:`SchedulerError` that nothing
    catches prints as one line, ``torchx: error: ...`` (exit code 1, as TorchX's own), not
    as a traceback: it is bad input or an orchestrator's answer, not a bug. Every other
    exception keeps Python's hook. Installed once, by each scheduler's constructor."""
    import sys

    if "torchx.cli.main" not in sys.modules or getattr(sys.excepthook, "torchstep_one_line", False):
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if issubclass(kind, SpecError | SchedulerError):
            sys.stderr.write(f"torchx: error: {' '.join(str(value).split())}\n")
        else:
            previous(kind, value, tb)

    hook.torchstep_one_line = True  # type: ignore[attr-defined]
    sys.excepthook = hook


# -- options ----------------------------------------------------------------------------
def parse(cfg: Mapping[str, Any], table: OptionTable, *, scheduler: str, target: str | None) -> dict[str, Any]:
    """The defaults of ``table`` overlaid with ``cfg`` converted to the options' types
    (:func:`torchstep.plan.options.parse_options`).

    Args:
        cfg: the options as TorchX hands them over (``None``: not given).
        table: ``name -> (type, default, help)``, the scheduler's ``OPTIONS``.
        scheduler: the scheduler's name (``torchx runopts <scheduler>`` in the fixes).
        target: the torchstep target the options belong to (``None``: the orchestrator's).

    Returns:
        Every option of the table, by name.

    Raises:
        SpecError: an unknown option or a value of the wrong type, naming ``cfg['<key>']``.
    """
    out = {key: default for key, (_, default, _) in table.items()}
    out.update(parse_options(cfg, table, target=target, scheduler=scheduler))
    return out


def check_endpoint(url: str, field: str, target: str | None, *, fix: str) -> str:
    """``url`` without its trailing ``/``; a SpecError naming ``field`` unless it is an
    http(s) URL with a host and without credentials, query or fragment
    (:func:`torchstep.schedulers.rules.url_problem`) — a record or a dry run must never hold
    a password (the URL itself is then not repeated either)."""
    problem = url_problem(url)
    if problem is not None:
        raise SpecError(field, target, problem, fix=fix)
    return url.rstrip("/")


def endpoint(url: str | None, *, api: str, target: str | None, fix: str) -> str:
    """The checked ``cfg['endpoint']`` (:func:`check_endpoint`); a SpecError saying there is
    no ``api`` to submit to when ``url`` is empty."""
    if not url:
        raise SpecError("cfg['endpoint']", target, f"no {api} to submit to", fix=fix)
    return check_endpoint(url, "cfg['endpoint']", target, fix=fix)


def check_secret_var(opts: Mapping[str, Any], key: str, *, default: str | None, target: str | None) -> None:
    """Check ``opts[key]``, the NAME of the environment variable holding a credential.

    Args:
        opts: the parsed options.
        key: the option (``token_env``, ``api_key_env``...); ``None`` as value: no variable.
        default: the option's default: that variable may be unset (no credential); one named
            explicitly must be set in this process.
        target: the SpecError's target.

    Raises:
        SpecError: the value is not a name by :data:`SECRET_VAR` (a secret given in its place:
            refused, never repeated), or a variable named explicitly is not set.
    """
    name = opts.get(key)
    if name is None:
        return
    if not SECRET_VAR.fullmatch(name):
        raise SpecError(
            f"cfg[{key!r}]",
            target,
            "must be the NAME of an environment variable (upper-case letters, digits and "
            f"'_'), never the secret itself: what was named by {key} (not shown) is not such a name",
            fix=f"export the secret in a variable and pass its name: -cfg {key}=MY_VAR",
        )
    if name != default and secret(name) is None:
        raise SpecError(
            f"cfg[{key!r}]",
            target,
            f"the variable ${name} is not set or empty",
            fix=f"export {name}=<the secret>, or drop {key}",
        )


def secret(name: str | None) -> str | None:
    """The credential held by the environment variable ``name``: the one place a scheduler
    reads one. It is sent to the endpoint, never printed, recorded or put in an error.

    Args:
        name: the variable an option names (checked by :func:`check_secret_var`).

    Returns:
        Its value; ``None`` when there is no name or the variable is unset or empty.
    """
    return (os.environ.get(name) or None) if name else None


def check_step_target(target: str, namespace: str | None, *, where: str | None = None) -> None:
    """``cfg['target']`` is one of :data:`STEP_TARGETS` and ``cfg['namespace']`` is given
    only for ``kubernetes``, as a DNS label; SpecErrors name the option (target ``where``)."""
    if target not in STEP_TARGETS:
        raise SpecError("cfg['target']", where, f"unknown target {target!r}", fix="-cfg target=local|kubernetes")
    if namespace is not None and target != "kubernetes":
        raise SpecError(
            "cfg['namespace']",
            where,
            "only applies to target=kubernetes (only the kubernetes target runs in a namespace)",
            fix="add -cfg target=kubernetes, or drop namespace",
        )
    check_namespace(namespace, target=where)


def check_namespace(namespace: str | None, *, target: str | None) -> None:
    """A SpecError naming ``cfg['namespace']`` unless it is ``None`` or a DNS-1123 label."""
    if namespace is not None and not is_dns_label(namespace):
        raise SpecError(
            "cfg['namespace']",
            target,
            f"{namespace!r} is not a Kubernetes namespace name",
            fix="lower-case letters, digits and '-', at most 63: e.g. -cfg namespace=team-a",
        )


def check_seconds(value: float, key: str, *, target: str | None) -> float:
    """``value`` when it is a positive, finite number of seconds (at most ten years): else
    a SpecError naming ``cfg['<key>']`` (``nan``, ``inf`` and ``0`` included)."""
    if not 0 < value <= MAX_SECONDS:
        raise SpecError(
            f"cfg[{key!r}]",
            target,
            f"must be a positive, finite number of seconds, got {value}",
            fix=f"e.g. -cfg {key}=30",
        )
    return value


# -- AppDefs and states ---------------------------------------------------------------------
def app_payload(app: AppDef, target: str) -> dict[str, Any]:
    """``app`` as JSON data (:func:`torchstep.components.appjson.app_to_dict`), after checking it
    builds a plan for ``target``: the orchestrator checks it again on arrival."""
    from torchstep.components.appjson import app_to_dict
    from torchstep.plan.planner import build_plan

    build_plan(app, target)
    return app_to_dict(app)


def app_received(
    data: Any,
    target: str,
    cfg: Mapping[str, Any] | None = None,
    policy: Any = None,
    *,
    field: str = "app",
    name_target: bool = True,
) -> tuple[AppDef, Any]:
    """The other end of :func:`app_payload`: the AppDef a scheduler sent as JSON data (a DAG
    run's conf, a flow run's parameters), checked before anything is created — its size and
    then its fields against the deployment's policy (:mod:`torchstep.policy`) for it and the
    run options ``cfg`` that came with it, and only then its plan for ``target``.

    Args:
        data: the AppDef as JSON data.
        target: ``local`` or ``kubernetes``.
        cfg: the run options sent with it.
        policy: a :class:`torchstep.policy.Policy`, the path of its TOML file, or ``None``:
            the file ``TORCHSTEP_POLICY`` names, else ``torchstep.policy.DEFAULT``.
        field: what the data is called in errors (``conf['app']``).
        name_target: whether an error in the data names the target (``False`` where what
            was sent says the target in a field of its own).

    Returns:
        The AppDef and its plan for ``target``.

    Raises:
        SpecError: a bad field (``conf['app'].roles[0].entrypoint``).
        torchstep.policy.PolicyError: a field the policy does not allow.
    """
    from torchstep.components.appjson import app_from_dict
    from torchstep.plan.planner import build_plan
    from torchstep.policy import resolve

    # the policy first, its size limits before anything is parsed: what a stranger sends
    # costs the worker what the policy allows, not what was sent
    checked = resolve(policy)
    checked.check_sent(data, target, cfg, field=field)
    try:
        app = app_from_dict(data)
    except SpecError as e:  # e.field is "app.roles[0]...": say where it is in what was sent
        raise SpecError(
            field + e.field.removeprefix("app"), target if name_target else None, e.problem, fix=e.fix
        ) from None
    except Exception as e:  # a shape app_from_dict does not check: still the data's fault
        raise SpecError(
            field,
            target if name_target else None,
            f"is not a valid AppDef ({type(e).__name__}: {e})",
            fix="submit it with `torchx run` (torchstep.components.appjson.app_to_dict)",
        ) from None
    checked.check(app, target, cfg)
    return app, build_plan(app, target)


def new_app_id(name: str) -> str:
    """``<name>-<6 chars>``: a DNS-label-safe, unique id for one submission."""
    from torchstep.plan.names import dns_label

    return f"{dns_label(name, max_len=50)}-{short_id(6)}"


def app_state(name: str | None) -> AppState:
    """A TorchX ``AppState`` by name (``UNKNOWN`` for anything else); a step state TorchX
    has no name for maps as :data:`torchstep.result.TORCHX_STATES` says (``PREEMPTED`` →
    ``FAILED``: the message gives the reason)."""
    name = TORCHX_STATES.get(name, name) if name else name
    return AppState[name] if name and name in AppState.__members__ else AppState.UNKNOWN


def response(app_id: str, state: AppState, msg: str = "", *, ui_url: str | None = None) -> DescribeAppResponse:
    """A ``DescribeAppResponse`` with the fields our schedulers fill."""
    resp = DescribeAppResponse()
    resp.app_id, resp.state, resp.msg, resp.ui_url = app_id, state, msg, ui_url
    return resp


def run_role_statuses(roles: Iterable[Any], state: AppState, hostname: str = "") -> list[RoleStatus]:
    """Every replica of ``roles`` in the run's ``state``: what an orchestrator that knows
    the state of the run, not of each replica, says of them."""
    return [
        RoleStatus(role.name, [ReplicaStatus(i, state, role.name, hostname) for i in range(role.num_replicas)])
        for role in roles
    ]


def roles_of(app: Any, *, lenient: bool = False) -> list[Any]:
    """The roles of a recorded AppDef (JSON data), for ``DescribeAppResponse.roles``: what
    ``torchx log`` checks a role name against.

    Args:
        app: the AppDef as JSON data.
        lenient: data that is not a whole AppDef gives the roles it names (name, image,
            replicas) instead of none: an orchestrator's run parameters, which anyone who may
            create runs could have written.

    Returns:
        The roles (``torchx.specs.Role``); unreadable data gives none.
    """
    from torchstep.components.appjson import app_from_dict

    try:
        return list(app_from_dict(app).roles)
    except (ValueError, TypeError, KeyError, AttributeError):  # not an AppDef's data
        if not lenient:
            return []
    from torchx.specs import Role

    roles = app.get("roles") if isinstance(app, dict) else None
    out = []
    for r in roles if isinstance(roles, list) else []:
        if isinstance(r, dict) and isinstance(r.get("name"), str):
            n = r.get("num_replicas", 1)
            out.append(Role(r["name"], image=str(r.get("image", "")), num_replicas=n if isinstance(n, int) else 1))
    return out


# -- logs -------------------------------------------------------------------------------
#: How a rank's line starts (``[role/rank] ...``, the agent's prefix) and how the launcher
#: names a replica in its events (``torchstep: role replica N STATE``).
_RANK_PREFIX = re.compile(r"\[([^/\]\s]+)/\d+\]")
_EVENT = re.compile(r"torchstep: (\S+) replica \d+ ")
#: The agent's own informational line (``[torchstep-agent <date> <time> INFO] ...``): the
#: agent's log (``agent.log``) holds it; its warnings and errors stay with the app's lines,
#: as torchrun's own do under TorchX's ``local_cwd``.
_AGENT_INFO = re.compile(r"\[torchstep-agent [^\]]* (?:DEBUG|INFO)\] ")


def role_of_line(line: str, roles: list[str]) -> str | None:
    """The role a line of a step's one combined log belongs to (a rank's ``[role/rank]``
    line, a launcher event about ``role replica N``), or ``None`` for the orchestrator's own.

    >>> role_of_line("[trainer/3] loss 0.1", ["trainer", "ps"]), role_of_line("Task failed", ["trainer"])
    ('trainer', None)
    """
    m = _RANK_PREFIX.match(line) or _EVENT.search(line)
    return m[1] if m and m[1] in roles else None


def lines_of_role(lines: Iterable[str], role: str, roles: list[str]) -> Iterator[str]:
    """The lines of ``role`` in an orchestrator's one log of the whole step (Airflow's task
    log, Prefect's flow-run log); the orchestrator's own lines go with the first role, so
    ``torchx log`` over every role shows each line once. The agent's informational lines
    are left out (:func:`app_lines`)."""
    first = not roles or role == roles[0]
    for line in app_lines(lines):
        owner = role_of_line(line, roles)
        if owner == role or (owner is None and first):
            yield line


def app_lines(lines: Iterable[str]) -> Iterator[str]:
    """``lines`` without the agent's informational lines (they are in its ``agent.log``).

    >>> list(app_lines(["[torchstep-agent 2026-01-01 10:00:00,1 INFO] attempt 0", "[w/0] hi"]))
    ['[w/0] hi']
    """
    return (line for line in lines if not _AGENT_INFO.match(line))


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


# -- the scheduler class ----------------------------------------------------------------
class TorchstepScheduler(Scheduler[Mapping[str, Any]]):
    """The base of our TorchX schedulers. A subclass names its ``BACKEND`` and ``OPTIONS``
    (as class attributes, or ``class X(TorchstepScheduler, backend=..., options=...)``) and
    implements ``_submit_dryrun`` (every check the submission runs without the orchestrator:
    a SpecError naming the option or field), ``schedule``, ``describe``, ``_cancel_existing``
    and :meth:`_log_lines`.

    TorchX's own pre-check (a resource on every role) is not ours to impose — the local
    target runs without one — and the target that will run the AppDef is only known from
    ``cfg``: the dry run checks the AppDef with :func:`app_payload` instead.
    """

    BACKEND: ClassVar[str]
    #: ``name -> (type, default, help)``: ``torchx runopts <BACKEND>``.
    OPTIONS: ClassVar[OptionTable] = {}
    #: Errors that mean "this orchestrator cannot be reached now": ``list`` skips such an app.
    unreachable: tuple[type[Exception], ...] = (SchedulerError,)

    def __init_subclass__(cls, *, backend: str | None = None, options: OptionTable | None = None, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if backend is not None:
            cls.BACKEND = backend
        if options is not None:
            cls.OPTIONS = options

    def __init__(self, session_name: str, **_: Any) -> None:
        super().__init__(self.BACKEND, session_name)
        one_line_errors_under_torchx_cli()

    def _run_opts(self) -> runopts:
        return to_runopts(self.OPTIONS)  # type: ignore[no-any-return]

    def _validate(self, app: AppDef, scheduler: str) -> None:
        return None

    def _record(self, app_id: str) -> dict[str, Any] | None:
        """The private record of ``app_id`` (``None``: not submitted from here, or not an id
        this scheduler hands out)."""
        from torchstep.schedulers import records

        try:
            return records.load(self.BACKEND, app_id)
        except ValueError:  # not an id we hand out (a '/' in it...): no record to read
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
        for app_id in records.app_ids(self.BACKEND):
            try:
                desc = self.describe(app_id)
            except self.unreachable:
                continue
            if desc is not None:
                out.append(ListAppResponse(app_id=app_id, state=desc.state))
        return out

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """The app's lines of replica ``k`` of ``role_name`` (:meth:`_log_lines`), each ending
        in a newline, those matching ``regex``; ``should_tail`` follows them to the end.
        ``streams``: only ``combined`` (stdout and stderr in the order they were written)."""
        check_stream(streams, self.BACKEND)
        return select_lines(self._log_lines(app_id, role_name, k, since=since, until=until, tail=should_tail), regex)

    def _log_lines(
        self, app_id: str, role_name: str, k: int, *, since: datetime | None, until: datetime | None, tail: bool
    ) -> Iterable[str]:
        raise NotImplementedError
