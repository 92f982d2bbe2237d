"""The agent's settings as one table and the one rule that reads it: where each setting's
value may come from, in order, first given wins — torch's ``argparse_util.env`` rule
(``--flag`` > ``PET_<NAME>`` > default) written down per setting instead of per action:

* torchstep's own flags: ``--flag`` > ``TORCHSTEP_*`` variable > default;
* torchrun's flags: ``--flag`` > ``PET_*`` variable > torchstep's pipeline default > torch's;
* :data:`LAUNCHER_OVERRIDES` win over both (applied by ``resolve`` after torchrun's own rules).

:func:`pick` applies one row and says where the value came from (its *provenance*, as the
agent's settings list prints it: ``flag``, ``env NAME``, ``default``...). Nothing here
touches the process or the disk.

Example::

    >>> from types import SimpleNamespace
    >>> from torchstep.agent.settings_table import UNSET, setting, pick
    >>> pick(setting("grace_period"), SimpleNamespace(grace_period=UNSET, shutdown_timeout=12), {})
    (12.0, '--shutdown-timeout')
    >>> pick(setting("log_dir"), SimpleNamespace(log_dir=UNSET), {"PET_LOG_DIR": "/logs"})
    ('/logs', 'env PET_LOG_DIR')
"""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchstep.contract import (
    ENV_EXIT_BARRIER_TIMEOUT,
    ENV_GRACE_PERIOD,
    ENV_HANG_TIMEOUT,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_LOG_DIR,
    ENV_LOG_PREFIX,
    ENV_RDZV_BACKEND,
    ENV_RDZV_ENDPOINT,
    ENV_RDZV_ID,
    ENV_REPLICA_ID,
    ENV_RESULT_FILE,
    ENV_ROLE,
    ENV_STOP_TIMEOUT,
    ENV_WATCHDOG_TIMEOUT,
    ENV_ZYGOTE,
)

#: pytorch#135712: a restarted gloo group must not read stale data from the shared store.
ENV_NO_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
_OFF = ("0", "false", "no", "off")
_ON = ("1", "true", "yes", "on")

#: torchrun handles SIGTERM, SIGINT, SIGHUP and SIGQUIT; we add the two SLURM/preemption ones.
DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"

#: Rendezvous defaults for the dynamic backends (each overridable with --rdzv-conf k=v):
#: pods may start minutes apart (join/read timeouts), survivors re-form the group within
#: seconds of a node loss (last call 1 s; torch's defaults take ~40 s). A node is declared
#: dead after keep_alive_interval x keep_alive_max_attempt; torch sends a heartbeat only on
#: a timer tick at least one interval after the last one, i.e. every *two* intervals, so
#: the product must exceed two intervals with room for a busy host: with the interval left
#: at its default the agent ticks every 0.5 s (KEEP_ALIVE_PERIOD_S; torch's flag takes whole
#: seconds only), heartbeats land every <= 1 s, and a node is dead after 2 s of silence.
DYNAMIC_RDZV_DEFAULTS: dict[str, str] = {
    "join_timeout": "900",
    "last_call_timeout": "1",
    "close_timeout": "10",
    "keep_alive_interval": "1",
    "keep_alive_max_attempt": "4",
}
#: The keep-alive tick the agent uses when ``keep_alive_interval`` is not given.
KEEP_ALIVE_PERIOD_S = 0.5
#: c10d has the liveness monitor (torchstep.agent.liveness), which removes a node whose
#: heartbeat stopped *and* whose host or agent does not answer a probe within ~4 s; torch's own
#: expiry (0.5 s tick x 60 = 30 s) is then only the bound for an agent that is there but
#: sends nothing (a stall): with x 4 (2 s) a peer agent stalled 5 s on a loaded machine was
#: dropped from the rendezvous (its heartbeats then stop for good).
C10D_RDZV_DEFAULTS: dict[str, str] = {**DYNAMIC_RDZV_DEFAULTS, "read_timeout": "900", "keep_alive_max_attempt": "60"}

#: A flag's value when the command line did not give it (so that a variable may fill it).
UNSET: Any = object()
#: In :attr:`Setting.order`: this setting's own flag.
FLAG = "flag"


class UsageError(ValueError):
    """A bad flag or environment value (the agent exits with 2, like argparse).

    Example: ``resolve(["t.py"], environ={"TORCHSTEP_GRACE_PERIOD": "soon"})`` raises it.
    """


def _on_off(value: str) -> bool:
    text = value.strip().lower()
    if text not in (*_ON, *_OFF):
        raise ValueError("use 1 (fork Python workers from the zygote, the default) or 0 (exec)")
    return text in _ON


def _zygote_label(where: str, value: Any, raw: str | None) -> str:
    if where == FLAG:
        return "--zygote" if value else "--no-zygote"
    return f"{where}={(raw or '').strip()}"


@dataclass(frozen=True)
class Setting:
    """One row of :data:`SETTINGS`: where a setting's value may come from and its default.

    Attributes:
        dest: the argparse destination (``grace_period``), also the key of its provenance.
        order: where to look, first given wins: :data:`FLAG` (this setting's flag),
            another flag (``"--shutdown-timeout"``), or a variable. A ``PET_*`` variable
            counts when present, as torch reads it; any other when not blank.
        default: the value when none of them is given.
        kind: parses a variable's (or another flag's) value; a ``ValueError`` becomes a
            :class:`UsageError` naming the variable.
        flags: torchstep's own spellings, added to torchrun's parser with :attr:`help`;
            empty for a flag that torchrun's parser (or ``build_parser`` itself) declares.
        help: the flag's help text.
        default_source: the provenance of the default (None: not recorded).
        skip_blank: an empty flag or variable counts as not given.
        minimum: the smallest value allowed (a :class:`UsageError` below it).
        label: formats the provenance from ``(where, value, raw variable value)``.

    Example: ``Setting("stop_timeout", (FLAG, "TORCHSTEP_STOP_TIMEOUT"), 10.0, float)``.
    """

    dest: str
    order: tuple[str, ...]
    default: Any = None
    kind: Callable[[Any], Any] = str
    flags: tuple[str, ...] = ()
    help: str = ""
    default_source: str | None = "default"
    skip_blank: bool = False
    minimum: float | None = None
    label: Callable[[str, Any, str | None], str] | None = None

    @property
    def env(self) -> str:
        """The first variable in :attr:`order` (the one ``--help`` names)."""
        return next(where for where in self.order if where != FLAG and not where.startswith("-"))


def _ours(dest: str, env: str, kind: Callable[[str], Any], default: Any, text: str, **kw: Any) -> Setting:
    """A torchstep flag: ``--dest`` (and ``--dest_with_underscores``) > ``env`` > default."""
    spelled = f"--{dest.replace('_', '-')}"
    return Setting(dest, (FLAG, env), default, kind, (spelled, f"--{dest}"), text, **kw)


def _torchrun(dest: str, default: Any, *, kind: Callable[[str], Any] = str, **kw: Any) -> Setting:
    """A torchrun flag, read as torch's ``env`` action reads it: ``--flag`` > ``PET_<DEST>``."""
    kw.setdefault("default_source", None)
    return Setting(dest, (FLAG, f"PET_{dest.upper()}"), default, kind, **kw)


#: Every setting with a precedence of its own. torchrun flags not listed here keep torch's
#: own ``env`` action (``--nnodes`` > ``PET_NNODES`` > torch's default, read by its parser).
SETTINGS: tuple[Setting, ...] = (
    _ours(
        "result_file",
        ENV_RESULT_FILE,
        str,
        None,
        "write the versioned step result JSON here, atomically, on every exit path",
    ),
    _ours(
        "heartbeat_timeout",
        ENV_HEARTBEAT_TIMEOUT,
        float,
        0.0,
        "kill and restart a worker that has not called torchstep.heartbeat() for S seconds (0: off)",
        minimum=0,
    ),
    _ours(
        "hang_timeout",
        ENV_HANG_TIMEOUT,
        float,
        0.0,
        "when no rank printed, called torchstep.heartbeat() or torchstep.progress() for S seconds: take every "
        "rank's stacks and fail the group (retryable; 0: off)",
        minimum=0,
    ),
    # one default with `torchstep run` and the adapters (their grace_period option): 10 s
    Setting(
        "grace_period",
        (FLAG, ENV_GRACE_PERIOD, "--shutdown-timeout", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"),
        10.0,
        float,
        ("--grace-period", "--grace_period"),
        "seconds between forwarding a signal to the workers and SIGKILL of their process groups (torch: 30)",
        minimum=0,
    ),
    _ours(
        "stop_timeout",
        ENV_STOP_TIMEOUT,
        float,
        10.0,
        "seconds between SIGTERM and SIGKILL when the agent stops a group after a failure (torch: 30)",
        minimum=0,
    ),
    _ours(
        "exit_barrier_timeout",
        ENV_EXIT_BARRIER_TIMEOUT,
        float,
        60.0,
        "seconds a finished agent waits for the other agents to finish (torch: 300)",
        minimum=0,
    ),
    _ours(
        "watchdog_timeout",
        ENV_WATCHDOG_TIMEOUT,
        float,
        60.0,
        "fail with exit 83 when the elastic loop makes no progress this long (0: off)",
        minimum=0,
    ),
    _ours("replica_id", ENV_REPLICA_ID, int, None, "replica id reported in the result"),
    Setting("zygote", (FLAG, ENV_ZYGOTE), True, _on_off, label=_zygote_label),
    _torchrun("rdzv_backend", "static"),
    _torchrun("rdzv_endpoint", ""),
    _torchrun("rdzv_id", "none"),
    _torchrun("node_rank", 0, kind=int),
    _torchrun("signals_to_handle", DEFAULT_SIGNALS, default_source="default: + SIGUSR1,SIGUSR2"),
    # the launcher's role wins over the command line; TorchX writes `--role ''` (-> default)
    Setting("role", (ENV_ROLE, FLAG, "PET_ROLE"), "default", default_source=None),
    Setting(
        "log_dir", (FLAG, ENV_LOG_DIR, "PET_LOG_DIR"), None, default_source="default: new directory", skip_blank=True
    ),
)

#: What ``--help`` says is the default of a setting whose default is not a value.
_DEFAULT_SHOWN = {"replica_id": "this agent's node rank"}

#: Launcher variables that replace a torchrun flag after torchrun's own rules ran: the local
#: launcher hosts the rendezvous store and tells every agent (also one started by a
#: ``torchrun ...`` line through the shim) where it is.
LAUNCHER_OVERRIDES: tuple[tuple[str, str], ...] = (
    (ENV_RDZV_BACKEND, "rdzv_backend"),
    (ENV_RDZV_ENDPOINT, "rdzv_endpoint"),
    (ENV_RDZV_ID, "rdzv_id"),
)


def setting(dest: str) -> Setting:
    """The row of :data:`SETTINGS` for ``dest``.

    Args:
        dest: the setting's argparse destination, e.g. ``"log_dir"``.

    Returns:
        Its :class:`Setting`.

    Raises:
        KeyError: no row has that ``dest``.
    """
    for row in SETTINGS:
        if row.dest == dest:
            return row
    raise KeyError(dest)


def read_env(environ: Mapping[str, str], name: str) -> str | None:
    """A variable's value, None when not given: a ``PET_*`` variable is given when present
    (torch's ``os.environ.get``), any other when not blank.

    Args:
        environ: the environment to read.
        name: the variable.

    Returns:
        The value, or None.

    Example: ``read_env({"TORCHSTEP_LOG_DIR": " "}, "TORCHSTEP_LOG_DIR")`` is None.
    """
    value = environ.get(name)
    if name.startswith("PET_") or value is None:
        return value
    return value if value.strip() else None


def pick(row: Setting, args: Any, environ: Mapping[str, str]) -> tuple[Any, str | None]:
    """Apply one row's precedence.

    Args:
        row: the setting.
        args: the parsed command line; a flag not given is :data:`UNSET` (this row's) or
            None (another flag's argparse default).
        environ: the environment to read variables from.

    Returns:
        ``(value, provenance)``: provenance is ``flag``, the other flag's name,
        ``env NAME``, or :attr:`Setting.default_source`.

    Raises:
        UsageError: a variable's value does not parse, or the value is below the minimum.
    """
    for where in row.order:
        raw = None
        is_flag = where == FLAG or where.startswith("-")
        if is_flag:
            # a flag the user's torchrun lacks (--shutdown-timeout on 2.4-2.11): not given
            given = getattr(args, row.dest if where == FLAG else where.lstrip("-").replace("-", "_"), None)
            if given is UNSET or given is None or (row.skip_blank and not str(given).strip()):
                continue
            value = given if where == FLAG else row.kind(given)
        else:
            raw = read_env(environ, where)
            if raw is None or (row.skip_blank and not raw.strip()):
                continue
            try:
                value = row.kind(raw)
            except ValueError as e:
                raise UsageError(f"{where}={raw!r}: {e}") from None
        if row.minimum is not None and value < row.minimum:
            raise UsageError(f"--{row.dest.replace('_', '-')} must be >= {row.minimum:g}, got {value}")
        if row.label is not None:
            return value, row.label(where, value, raw)
        return value, where if is_flag else f"env {where}"
    return row.default, row.default_source


def build_parser() -> ArgumentParser:
    """torchrun's parser (``torch.distributed.run.get_args_parser``) plus torchstep's flags.
    Every flag with a row in :data:`SETTINGS` defaults to :data:`UNSET` (:func:`pick`
    fills it from the variables or the default).

    Returns:
        The parser.

    Example: ``build_parser().parse_args(["--heartbeat-timeout", "60", "t.py"]).heartbeat_timeout`` is 60.0.
    """
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    parser.prog = "torchstep-agent"
    parser.description = (
        "torchrun-compatible step entrypoint: every torchrun flag and PET_* variable works; "
        "torchstep adds the flags below (each also settable by its TORCHSTEP_* variable)."
    )
    rows = {row.dest for row in SETTINGS}
    for action in parser._actions:
        if action.dest in rows:  # torch's env action read PET_* from os.environ: pick() reads it instead
            action.default = UNSET
        elif action.dest == "master_port" and action.default == 29500:
            # torchrun 2.4-2.11 defaults it to 29500 (a single-node run then binds a static store
            # there, so two runs on one host collide); newer ones leave it unset and give a
            # single node a private c10d store on a free port. The agent does so on every torch
            # (resolve() still uses 29500 wherever a master port is needed).
            action.default = None
    group = parser.add_argument_group("torchstep")
    group.add_argument(
        "--log-prefix",
        "--log_prefix",
        dest="log_prefix",
        action="store_true",
        help="prefix each console line with [role/rank] and merge a binary worker's stderr into its stdout "
        f"(one ordered log per rank; env {ENV_LOG_PREFIX}=1; on by default under a torchstep launcher, "
        "or with --tee / --local-ranks-filter)",
    )
    group.add_argument(
        "--zygote",
        dest="zygote",
        action="store_const",
        const=True,
        default=UNSET,
        help="fork Python workers from a process that imported torch once (faster start and restart; "
        "the default; see docs/agent.md)",
    )
    group.add_argument(
        "--no-zygote",
        dest="zygote",
        action="store_const",
        const=False,
        help=f"start every worker as a new process (exec) instead (env {ENV_ZYGOTE}=0)",
    )
    for row in SETTINGS:
        if not row.flags:
            continue
        shown = "off" if row.default in (None, 0.0) else f"{row.default:g}" if row.kind is float else row.default
        shown = _DEFAULT_SHOWN.get(row.dest, shown)
        group.add_argument(
            *row.flags,
            dest=row.dest,
            type=row.kind,
            default=UNSET,
            metavar="PATH" if row.kind is str else "S" if row.kind is float else "N",
            help=f"{row.help} (env {row.env}; default {shown})",
        )
    return parser


def zygote_from_env(environ: Mapping[str, str]) -> bool:
    """Whether ``TORCHSTEP_ZYGOTE`` leaves the worker zygote on: it is, unless the variable
    says ``0`` / ``false`` / ``no`` / ``off`` (``resolve`` refuses other values).

    Args:
        environ: the environment to read.

    Returns:
        Whether the zygote is on.

    Example: ``zygote_from_env({"TORCHSTEP_ZYGOTE": "0"})`` is ``False``; ``zygote_from_env({})`` is ``True``.
    """
    return (read_env(environ, ENV_ZYGOTE) or "").strip().lower() not in _OFF
