"""The agent's command line and environment: torchrun's own parser plus torchstep's flags,
launcher overrides and pipeline defaults, resolved into one :class:`AgentSettings`.

Precedence, per setting:

* torchstep flags: ``--flag`` > ``TORCHSTEP_*`` variable > default.
* torchrun flags: ``--flag`` > ``PET_*`` variable > torchstep's pipeline default > torch's.
* launcher overrides win over both: ``TORCHSTEP_RDZV_BACKEND/ENDPOINT/ID/CONF`` and
  ``TORCHSTEP_ROLE`` (the local launcher hosts the rendezvous store itself and tells
  every agent, also one started by a ``torchrun ...`` line through the shim, where it is).

Example::

    >>> from torchstep.agent.settings import resolve
    >>> s = resolve(["--nnodes", "2", "--nproc-per-node", "2", "train.py"], environ={})
    >>> s.config.rdzv_backend, s.config.rdzv_configs["last_call_timeout"], s.grace_period
    ('c10d', '1', 30.0)
    >>> s = resolve(["--rdzv-backend", "static", "train.py"], environ={"TORCHSTEP_RDZV_BACKEND": "c10d",
    ...             "TORCHSTEP_RDZV_ENDPOINT": "10.0.0.1:29400", "TORCHSTEP_RDZV_CONF": "is_host=false"})
    >>> s.config.rdzv_endpoint, s.config.rdzv_configs["is_host"], s.sources["rdzv_endpoint"]
    ('10.0.0.1:29400', 'false', 'env TORCHSTEP_RDZV_ENDPOINT')
"""

from __future__ import annotations

import os
import tempfile
import uuid
from argparse import ArgumentParser
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchstep.contract import (
    ENV_APP_ID,
    ENV_EXIT_BARRIER_TIMEOUT,
    ENV_GRACE_PERIOD,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_LOG_DIR,
    ENV_LOG_PREFIX,
    ENV_RDZV_BACKEND,
    ENV_RDZV_CONF,
    ENV_RDZV_ENDPOINT,
    ENV_RDZV_ID,
    ENV_REPLICA_ID,
    ENV_RESULT_FILE,
    ENV_ROLE,
    ENV_RUN_DIR,
    ENV_STOP_TIMEOUT,
    ENV_WATCHDOG_TIMEOUT,
)
from torchstep.files import UnsafePathError, private_root

#: pytorch#135712: a restarted gloo group must not read stale data from the shared store.
ENV_NO_SHARED_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
#: ``TORCHSTEP_ZYGOTE``: ``0`` turns the worker zygote off (on by default).
ENV_ZYGOTE = "TORCHSTEP_ZYGOTE"
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
C10D_RDZV_DEFAULTS: dict[str, str] = {**DYNAMIC_RDZV_DEFAULTS, "read_timeout": "900"}

_UNSET: Any = object()
# torchrun flags whose "was it given?" matters (to apply our defaults only when it was not)
_TRACKED = {
    "rdzv_backend": "static",
    "rdzv_endpoint": "",
    "rdzv_id": "none",
    "node_rank": 0,
    "role": "default",
    "signals_to_handle": DEFAULT_SIGNALS,
    "log_dir": None,
}


class UsageError(ValueError):
    """A bad flag or environment value (the agent exits with 2, like argparse).

    Example: ``resolve(["t.py"], environ={"TORCHSTEP_GRACE_PERIOD": "soon"})`` raises it.
    """


class TorchrunError(UsageError):
    """A command line torchrun's own checks refuse (``--no-python`` with ``--module``,
    ``--nproc-per-node=unknown``, an unknown ``--logs-specs``...): the agent ends as torchrun
    does, with torchrun's exception line (:attr:`line`, e.g. ``ValueError: Unsupported
    nproc_per_node value: unknown``) last on stderr and torchrun's exit status 1.

    Example: ``resolve(["--nproc-per-node=unknown", "t.py"], environ={})`` raises it; ``str(err)``
    is torchrun's message, ``err.line`` adds the exception's type.
    """

    #: torchrun's exit status for an exception raised while it parses its arguments.
    exit_code = 1

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.kind = type(error).__name__

    @property
    def line(self) -> str:
        text = str(self)
        return f"{self.kind}: {text}" if text else self.kind


@dataclass(frozen=True)
class Flag:
    """A torchstep flag with its environment variable and default.

    Example: ``Flag("grace_period", ("--grace-period",), "TORCHSTEP_GRACE_PERIOD", float, 30.0, "...")``.
    """

    dest: str
    flags: tuple[str, ...]
    env: str
    kind: Callable[[str], Any]
    default: Any
    help: str


FLAGS: tuple[Flag, ...] = (
    Flag(
        "result_file",
        ("--result-file", "--result_file"),
        ENV_RESULT_FILE,
        str,
        None,
        "write the versioned step result JSON here, atomically, on every exit path",
    ),
    Flag(
        "heartbeat_timeout",
        ("--heartbeat-timeout", "--heartbeat_timeout"),
        ENV_HEARTBEAT_TIMEOUT,
        float,
        0.0,
        "kill and restart a worker that has not called torchstep.heartbeat() for S seconds (0: off)",
    ),
    Flag(
        "grace_period",
        ("--grace-period", "--grace_period"),
        ENV_GRACE_PERIOD,
        float,
        30.0,
        "seconds between forwarding a signal to the workers and SIGKILL of their process groups",
    ),
    Flag(
        "stop_timeout",
        ("--stop-timeout", "--stop_timeout"),
        ENV_STOP_TIMEOUT,
        float,
        10.0,
        "seconds between SIGTERM and SIGKILL when the agent stops a group after a failure (torch: 30)",
    ),
    Flag(
        "exit_barrier_timeout",
        ("--exit-barrier-timeout", "--exit_barrier_timeout"),
        ENV_EXIT_BARRIER_TIMEOUT,
        float,
        60.0,
        "seconds a finished agent waits for the other agents to finish (torch: 300)",
    ),
    Flag(
        "watchdog_timeout",
        ("--watchdog-timeout", "--watchdog_timeout"),
        ENV_WATCHDOG_TIMEOUT,
        float,
        60.0,
        "fail with exit 83 when the elastic loop makes no progress this long (0: off)",
    ),
    Flag(
        "replica_id",
        ("--replica-id", "--replica_id"),
        ENV_REPLICA_ID,
        int,
        None,
        "replica id reported in the result (default: this agent's node rank)",
    ),
)


@dataclass
class AgentSettings:
    """Everything the agent runs with (see ``docs/agent.md`` for each field).

    Example: ``resolve(["--nproc-per-node", "2", "t.py"], environ={}).config.nproc_per_node`` is 2.
    """

    config: Any  # torch.distributed.launcher.api.LaunchConfig
    entrypoint: str | Callable[..., Any]
    entry_args: list[str]
    role: str
    app_id: str
    replica_id: int | None
    log_dir: str
    result_files: list[str]
    heartbeat_timeout: float
    grace_period: float
    stop_timeout: float
    exit_barrier_timeout: float
    watchdog_timeout: float
    echo_ranks: Callable[[int], bool]
    prefix_template: str | None
    process_env: dict[str, str] = field(default_factory=dict)
    consumed_env: list[str] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    #: Where the agent's private run state goes (``TORCHSTEP_RUN_DIR``; None: the temp dir).
    run_dir_parent: str | None = None
    #: Whether a local rank's stdout and stderr console lines are prefixed (``[role/rank] ``
    #: in pipelines, torchrun's ``[role0]:`` where ``--tee`` copies a stream).
    prefixed: Callable[[int], tuple[bool, bool]] = lambda _: (True, True)
    #: A binary worker's stderr merged into its stdout log (one ordered log per rank).
    merge_streams: bool = False
    #: ``--logs-specs NAME``: torchrun's ``torchrun.logs_specs`` entry point decides where
    #: the streams go (``config.logs_specs``), as under torchrun.
    custom_logs_specs: bool = False
    #: Python workers are forked from the worker zygote (the default; ``--no-zygote`` /
    #: ``TORCHSTEP_ZYGOTE=0`` turn it off). See :meth:`exec_reason` for the other fallbacks.
    zygote: bool = True

    def rendezvous_bound(self) -> float:
        """Longest time one rendezvous may take by its own settings (for the watchdog)."""
        conf = self.config.rdzv_configs

        def num(key: str, default: float) -> float:
            try:
                return float(conf.get(key, default))
            except (TypeError, ValueError):
                return default

        backend = self.config.rdzv_backend
        if backend in ("c10d", "etcd-v2"):
            return num("join_timeout", 600) + num("last_call_timeout", 30)
        if backend == "etcd":
            return num("timeout", 900) + num("last_call_timeout", 30)
        return num("timeout", 900)

    def exec_reason(self) -> str:
        """Why no worker of this run is forked from the worker zygote ("" when they are):
        it is off, or the workers are not Python scripts or modules run by this interpreter,
        or this is not Linux.

        Example: ``resolve(["--no-zygote", "t.py"], environ={}).exec_reason()`` is ``"--no-zygote"``.
        """
        import sys

        from torchstep.agent._exec import python_request

        if not self.zygote:
            return self.sources.get("zygote", "off")
        if not isinstance(self.entrypoint, str):
            return "--run-path function"
        if python_request([self.entrypoint, *self.entry_args]) is None:
            return "not a Python script run by this interpreter"
        if not sys.platform.startswith("linux"):
            return "not Linux"
        return ""

    def summary(self) -> str:
        """The settings that tell runs apart, on one line."""
        c = self.config
        rdzv = f"{c.rdzv_backend}@{c.rdzv_endpoint}" if c.rdzv_endpoint else c.rdzv_backend
        return (
            f"torchstep-agent effective settings: nnodes {c.min_nodes}:{c.max_nodes}, nproc_per_node {c.nproc_per_node}, "
            f"rdzv {rdzv} id {c.run_id}, max_restarts {c.max_restarts}, logs {self.log_dir}"
        )

    def describe(self) -> str:
        """The effective settings, one per line, with where each came from."""
        c = self.config
        src = self.sources

        def line(name: str, value: Any, key: str | None = None) -> str:
            origin = src.get(key or name)
            return f"  {name:<24} {value}" + (f"  [{origin}]" if origin else "")

        rows = [
            "torchstep-agent effective settings:",
            line(
                "entrypoint",
                " ".join([str(getattr(self.entrypoint, "__qualname__", self.entrypoint)), *self.entry_args]),
            ),
            line("nnodes", f"{c.min_nodes}:{c.max_nodes}"),
            line("nproc_per_node", c.nproc_per_node),
            line("role", self.role),
            line("rdzv_backend", c.rdzv_backend),
            line("rdzv_endpoint", c.rdzv_endpoint),
            line("rdzv_id", c.run_id),
        ]
        rows += [line(f"rdzv_conf.{k}", v, f"rdzv_conf.{k}") for k, v in sorted(c.rdzv_configs.items())]
        rows += [
            line("max_restarts", c.max_restarts),
            line("monitor_interval", c.monitor_interval),
            line("start_method", c.start_method),
            line("signals_to_handle", c.signals_to_handle),
            line("grace_period", f"{self.grace_period:g}s"),
            line("stop_timeout", f"{self.stop_timeout:g}s"),
            line("exit_barrier_timeout", f"{self.exit_barrier_timeout:g}s"),
            line("watchdog_timeout", f"{self.watchdog_timeout:g}s" if self.watchdog_timeout > 0 else "off"),
            line("heartbeat_timeout", f"{self.heartbeat_timeout:g}s" if self.heartbeat_timeout > 0 else "off"),
            line("log_dir", self.log_dir),
            line("result_file", ", ".join(self.result_files) or "-"),
            line("replica_id", self.replica_id if self.replica_id is not None else "node rank"),
            line("worker_start", f"exec ({self.exec_reason()})" if self.exec_reason() else "zygote (fork)", "zygote"),
        ]
        rows += [line(k, v, k) for k, v in sorted(self.process_env.items())]
        return "\n".join(rows)


def build_parser(environ: Mapping[str, str] | None = None) -> ArgumentParser:
    """torchrun's parser (``torch.distributed.run.get_args_parser``) plus torchstep's flags.

    Example: ``build_parser().parse_args(["--heartbeat-timeout", "60", "t.py"]).heartbeat_timeout`` is 60.0.
    """
    from torch.distributed.run import get_args_parser

    env = os.environ if environ is None else environ
    parser = get_args_parser()
    parser.prog = "torchstep-agent"
    parser.description = (
        "torchrun-compatible step entrypoint: every torchrun flag and PET_* variable works; "
        "torchstep adds the flags below (each also settable by its TORCHSTEP_* variable)."
    )
    for action in parser._actions:
        if action.dest in _TRACKED and f"PET_{action.dest.upper()}" not in env:
            action.default = _UNSET
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
        default=None,
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
    for flag in FLAGS:
        shown = "off" if flag.default in (None, 0.0) else f"{flag.default:g}" if flag.kind is float else flag.default
        group.add_argument(
            *flag.flags,
            dest=flag.dest,
            type=flag.kind,
            default=_UNSET,
            metavar="PATH" if flag.kind is str else "S" if flag.kind is float else "N",
            help=f"{flag.help} (env {flag.env}; default {shown})",
        )
    return parser


def zygote_from_env(environ: Mapping[str, str]) -> bool:
    """Whether ``TORCHSTEP_ZYGOTE`` leaves the worker zygote on: it is, unless the variable
    says ``0`` / ``false`` / ``no`` / ``off`` (:func:`resolve` refuses other values).

    Example: ``zygote_from_env({"TORCHSTEP_ZYGOTE": "0"})`` is ``False``; ``zygote_from_env({})`` is ``True``.
    """
    return (_env(environ, ENV_ZYGOTE) or "").strip().lower() not in _OFF


def _zygote(args: Any, environ: Mapping[str, str], sources: dict[str, str]) -> bool:
    flag = getattr(args, "zygote", None)
    if flag is not None:
        sources["zygote"] = "--zygote" if flag else "--no-zygote"
        return bool(flag)
    value = _env(environ, ENV_ZYGOTE)
    if value is None:
        sources["zygote"] = "default"
        return True
    if value.strip().lower() not in (*_ON, *_OFF):
        raise UsageError(
            f"{ENV_ZYGOTE}={value!r}: use 1 (fork Python workers from the zygote, the default) or 0 (exec)"
        )
    sources["zygote"] = f"{ENV_ZYGOTE}={value.strip()}"
    return zygote_from_env(environ)


def _env(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "")
    return value if value.strip() else None


def _ours(args: Any, flag: Flag, environ: Mapping[str, str], sources: dict[str, str]) -> Any:
    value = getattr(args, flag.dest)
    if value is not _UNSET:
        sources[flag.dest] = "flag"
        return value
    raw = _env(environ, flag.env)
    if raw is not None:
        try:
            value = flag.kind(raw)
        except ValueError as e:
            raise UsageError(f"{flag.env}={raw!r}: {e}") from None
        sources[flag.dest] = f"env {flag.env}"
        return value
    sources[flag.dest] = "default"
    return flag.default


def _tracked(args: Any, dest: str, environ: Mapping[str, str], sources: dict[str, str]) -> bool:
    """Fill torch's default for an untouched tracked flag; ``True`` if the user set it."""
    if getattr(args, dest) is _UNSET:
        setattr(args, dest, _TRACKED[dest])
        return False
    pet = f"PET_{dest.upper()}"
    sources[dest] = f"env {pet}" if pet in environ else "flag"
    return True


def _echo_filter(args: Any, nproc: int) -> Callable[[int], bool]:
    """torchrun's console semantics: ``--local-ranks-filter`` and ``-r`` without ``-t``
    keep a rank off the console (its log file is complete either way)."""
    from torch.distributed.elastic.multiprocessing import Std, to_map

    redirects = to_map(Std.from_str(args.redirects), nproc)
    tee = to_map(Std.from_str(args.tee), nproc)
    shown = {int(r) for r in args.local_ranks_filter.split(",")} if args.local_ranks_filter else None

    def echo(local_rank: int) -> bool:
        if shown is not None and local_rank not in shown:
            return False
        return not (redirects.get(local_rank, Std.NONE) != Std.NONE and tee.get(local_rank, Std.NONE) == Std.NONE)

    return echo


#: torch's console prefix for ``--tee`` (``[default0]:line``), used when torchrun's own
#: flags turn prefixes on; torchstep's pipelines use ``[role/rank] `` (agent/logs.py).
TORCHRUN_PREFIX_TEMPLATE = "[${role_name}${local_rank}]:"


def _console_mode(
    args: Any, env: Mapping[str, str], nproc: int, sources: dict[str, str]
) -> tuple[bool, str | None, Callable[[int], tuple[bool, bool]]]:
    """``(merge, template, prefixed)`` of the console; ``prefixed(local_rank)`` says whether
    that rank's stdout and stderr lines get a prefix. Pipelines (``--log-prefix``,
    ``TORCHSTEP_LOG_PREFIX=1``, or run by a torchstep launcher: ``TORCHSTEP_APP_ID``) prefix
    every line ``[role/rank]`` and merge a binary worker's stderr into its one ordered log.
    Otherwise torchrun's console: stdout on stdout, stderr on stderr, a stream prefixed
    ``[role<local_rank>]:`` only where ``--tee`` copies it."""
    from torch.distributed.elastic.multiprocessing import Std, to_map

    template = _env(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    for on, why in (
        (args.log_prefix, "flag"),
        ((_env(env, ENV_LOG_PREFIX) or "").lower() in ("1", "true", "yes"), f"env {ENV_LOG_PREFIX}"),
        (_env(env, ENV_APP_ID) is not None, f"default: env {ENV_APP_ID} (a torchstep launcher)"),
    ):
        if on:
            sources["log_prefix"] = why
            return True, template, lambda _: (True, True)
    tee = to_map(Std.from_str(args.tee), nproc)

    def prefixed(local_rank: int) -> tuple[bool, bool]:
        std = tee.get(local_rank, Std.NONE)
        return std in (Std.OUT, Std.ALL), std in (Std.ERR, Std.ALL)

    return False, template or TORCHRUN_PREFIX_TEMPLATE, prefixed


def resolve(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Parse ``argv`` (without the program name) under ``environ`` into settings.

    Raises ``SystemExit`` (argparse) for a bad command line and :class:`UsageError` for
    a bad value. The process is left alone (the agent applies
    :attr:`AgentSettings.process_env` later), except for torchrun's own ``OMP_NUM_THREADS=1``
    default when several workers run.

    Example: ``resolve(["--nnodes", "2", "t.py"], environ={}).config.rdzv_backend`` is ``"c10d"``.
    """
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config
    from torch.distributed.run import config_from_args, parse_min_max_nnodes

    env = os.environ if environ is None else environ
    args = build_parser(env).parse_args(None if argv is None else list(argv))
    sources: dict[str, str] = {}
    backend_set = _tracked(args, "rdzv_backend", env, sources)
    _tracked(args, "rdzv_endpoint", env, sources)
    _tracked(args, "rdzv_id", env, sources)
    node_rank_set = _tracked(args, "node_rank", env, sources)
    if not _tracked(args, "signals_to_handle", env, sources):
        sources["signals_to_handle"] = "default: + SIGUSR1,SIGUSR2"
    _tracked(args, "role", env, sources)
    _tracked(args, "log_dir", env, sources)
    ours = {flag.dest: _ours(args, flag, env, sources) for flag in FLAGS}

    try:
        _, max_nodes = parse_min_max_nnodes(args.nnodes)
    except (ValueError, RuntimeError) as e:
        raise TorchrunError(e) from None

    # torchrun's own run() does this; config_from_args does not
    if args.standalone or (
        args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None and max_nodes == 1
    ):
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
        why = "--standalone" if args.standalone else "single node (torchrun)"
        sources.update(rdzv_backend=why, rdzv_endpoint=why, rdzv_id=why)
    elif max_nodes > 1 and not backend_set and not node_rank_set:
        # torch would use static rendezvous with every node claiming node rank 0
        args.rdzv_backend = "c10d"
        if not args.rdzv_endpoint:
            args.rdzv_endpoint = f"{args.master_addr}:{args.master_port or 29500}"
            sources["rdzv_endpoint"] = "default: --master-addr:--master-port"
        sources["rdzv_backend"] = "default: c10d when nnodes > 1"
    if args.master_port is None:
        args.master_port = 29500

    for name, dest in (
        (ENV_RDZV_BACKEND, "rdzv_backend"),
        (ENV_RDZV_ENDPOINT, "rdzv_endpoint"),
        (ENV_RDZV_ID, "rdzv_id"),
    ):
        value = _env(env, name)
        if value is not None:
            setattr(args, dest, value)
            sources[dest] = f"env {name}"
    role = _env(env, ENV_ROLE) or args.role or "default"
    if _env(env, ENV_ROLE):
        sources["role"] = f"env {ENV_ROLE}"
    args.role = role

    log_dir = args.log_dir if sources.get("log_dir") == "flag" else None
    log_dir = log_dir or _env(env, ENV_LOG_DIR) or args.log_dir
    if log_dir and os.path.abspath(log_dir) != os.devnull:
        sources["log_dir"] = sources.get("log_dir", "flag") if log_dir == args.log_dir else f"env {ENV_LOG_DIR}"
    else:
        # kept after the run (never deleted); its path is logged and in the result
        log_dir = tempfile.mkdtemp(prefix="torchstep-agent-")
        sources["log_dir"] = "default: new directory"
    args.log_dir = os.path.abspath(log_dir)
    try:  # a private directory of ours: created 0700 when missing, a symlink or foreign dir refused
        private_root(args.log_dir)
    except UnsafePathError as e:
        raise UsageError(f"--log-dir {e}") from None

    grace = ours["grace_period"]
    if sources["grace_period"] == "default":
        if args.shutdown_timeout is not None:
            grace, sources["grace_period"] = float(args.shutdown_timeout), "--shutdown-timeout"
        elif _env(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
            grace = float(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
            sources["grace_period"] = "env TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
    for dest in ("heartbeat_timeout", "stop_timeout", "exit_barrier_timeout", "watchdog_timeout"):
        if ours[dest] < 0:
            raise UsageError(f"--{dest.replace('_', '-')} must be >= 0, got {ours[dest]}")
    if grace < 0:
        raise UsageError(f"--grace-period must be >= 0, got {grace}")
    args.shutdown_timeout = max(0, round(grace))

    try:
        config, entrypoint, entry_args = config_from_args(args)
        conf = dict(config.rdzv_configs)
        defaults = (
            C10D_RDZV_DEFAULTS
            if args.rdzv_backend == "c10d"
            else (
                DYNAMIC_RDZV_DEFAULTS
                if args.rdzv_backend == "etcd-v2"
                else {"last_call_timeout": "1"}
                if args.rdzv_backend == "etcd"
                else {}
            )
        )
        for key, value in defaults.items():
            if key not in conf:
                conf[key] = value
                sources[f"rdzv_conf.{key}"] = "default"
        launcher_conf = _env(env, ENV_RDZV_CONF)
        if launcher_conf is not None:
            for key, value in _parse_rendezvous_config(launcher_conf).items():
                conf[key] = value
                sources[f"rdzv_conf.{key}"] = f"env {ENV_RDZV_CONF}"
        echo = _echo_filter(args, config.nproc_per_node)
        if config.nproc_per_node < 1:  # torch asserts it later, deep in the agent
            raise AssertionError(f"--nproc-per-node must be at least 1, got {config.nproc_per_node}")
    except (ValueError, AssertionError, RuntimeError) as e:  # torchrun's own checks of its flags
        raise TorchrunError(e) from None
    config.rdzv_configs = conf

    process_env = {}
    if ENV_NO_SHARED_STORE not in env:
        process_env[ENV_NO_SHARED_STORE] = "1"
        sources[ENV_NO_SHARED_STORE] = "default: pytorch#135712"
    result_files = []
    flag_result = ours["result_file"] if sources["result_file"] == "flag" else None
    for path in (flag_result, _env(env, ENV_RESULT_FILE)):
        # flag and launcher variable both given: write both, so the launcher finds its copy
        if path and os.path.abspath(path) not in result_files:
            result_files.append(os.path.abspath(path))
    merge, template, prefixed = _console_mode(args, env, config.nproc_per_node, sources)
    zygote = _zygote(args, env, sources)
    consumed = [
        ENV_LOG_PREFIX,
        ENV_RUN_DIR,
        ENV_RESULT_FILE,
        ENV_LOG_DIR,
        ENV_RDZV_BACKEND,
        ENV_RDZV_ENDPOINT,
        ENV_RDZV_ID,
        ENV_RDZV_CONF,
        *(f.env for f in FLAGS if f.env not in (ENV_REPLICA_ID,)),
    ]
    return AgentSettings(
        config=config,
        entrypoint=entrypoint,
        entry_args=list(entry_args),
        role=role,
        app_id=_env(env, ENV_APP_ID) or config.run_id,
        replica_id=ours["replica_id"],
        log_dir=args.log_dir,
        result_files=result_files,
        heartbeat_timeout=ours["heartbeat_timeout"],
        grace_period=grace,
        stop_timeout=ours["stop_timeout"],
        exit_barrier_timeout=ours["exit_barrier_timeout"],
        watchdog_timeout=ours["watchdog_timeout"],
        echo_ranks=echo,
        prefix_template=template,
        process_env=process_env,
        consumed_env=sorted(set(consumed)),
        sources=sources,
        run_dir_parent=_env(env, ENV_RUN_DIR) or None,
        prefixed=prefixed,
        merge_streams=merge,
        custom_logs_specs=bool(getattr(args, "logs_specs", None)),
        zygote=zygote,
    )
