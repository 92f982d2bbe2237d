"""The agent's command line and environment: torchrun's own parser plus torchstep's flags,
launcher overrides and pipeline defaults, resolved into one :class:`AgentSettings`.

Precedence, per setting (one table, :data:`torchstep.agent.settings_table.SETTINGS`):

* torchstep flags: ``--flag`` > ``TORCHSTEP_*`` variable > default.
* torchrun flags: ``--flag`` > ``PET_*`` variable > torchstep's pipeline default > torch's.
* launcher overrides win over both: ``TORCHSTEP_RDZV_BACKEND/ENDPOINT/ID/CONF`` and
  ``TORCHSTEP_ROLE`` (the local launcher hosts the rendezvous store itself and tells
  every agent, also one started by a ``torchrun ...`` line through the shim, where it is).

:func:`resolve` only reads: the runner creates the directories the settings name.

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

import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from torchstep.agent import compat
from torchstep.agent.settings_table import (
    C10D_RDZV_DEFAULTS,
    DEFAULT_SIGNALS,
    DYNAMIC_RDZV_DEFAULTS,
    ENV_NO_SHARED_STORE,
    KEEP_ALIVE_PERIOD_S,
    LAUNCHER_OVERRIDES,
    SETTINGS,
    UsageError,
    build_parser,
    pick,
    read_env,
    zygote_from_env,
)
from torchstep.contract import (
    ENV_APP_ID,
    ENV_LOG_DIR,
    ENV_LOG_PREFIX,
    ENV_RDZV_BACKEND,
    ENV_RDZV_CONF,
    ENV_RDZV_ENDPOINT,
    ENV_RDZV_ID,
    ENV_REPLICA_ID,
    ENV_RESULT_FILE,
    ENV_RUN_DIR,
    ENV_ZYGOTE,
)

__all__ = [
    "C10D_RDZV_DEFAULTS",
    "DEFAULT_SIGNALS",
    "DYNAMIC_RDZV_DEFAULTS",
    "ENV_NO_SHARED_STORE",
    "ENV_ZYGOTE",
    "KEEP_ALIVE_PERIOD_S",
    "TORCHRUN_PREFIX_TEMPLATE",
    "AgentSettings",
    "TorchrunError",
    "UsageError",
    "build_parser",
    "resolve",
    "zygote_from_env",
]


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
    #: ``--hang-timeout``: fail the group when no rank made progress this long (0: off).
    hang_timeout: float = 0.0
    #: ``--logs-specs NAME``: torchrun's ``torchrun.logs_specs`` entry point decides where
    #: the streams go (``config.logs_specs``), as under torchrun.
    custom_logs_specs: bool = False
    #: Builds that entry point's class on :attr:`log_dir` (the runner calls it: building it
    #: creates the directory, which :func:`resolve` never does); None without ``--logs-specs``.
    logs_specs_factory: Callable[[], Any] | None = None
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
            line("hang_timeout", f"{self.hang_timeout:g}s" if self.hang_timeout > 0 else "off"),
            line("log_dir", self.log_dir),
            line("result_file", ", ".join(self.result_files) or "-"),
            line("replica_id", self.replica_id if self.replica_id is not None else "node rank"),
            line("worker_start", f"exec ({self.exec_reason()})" if self.exec_reason() else "zygote (fork)", "zygote"),
            line("torch", compat.installed_torch() or "?", "torch"),
            line("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS") or "unset", "OMP_NUM_THREADS"),
        ]
        rows += [line(k, v, k) for k, v in sorted(self.process_env.items())]
        return "\n".join(rows)


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

    template = read_env(env, "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE")
    for on, why in (
        (args.log_prefix, "flag"),
        ((read_env(env, ENV_LOG_PREFIX) or "").lower() in ("1", "true", "yes"), f"env {ENV_LOG_PREFIX}"),
        (read_env(env, ENV_APP_ID) is not None, f"default: env {ENV_APP_ID} (a torchstep launcher)"),
    ):
        if on:
            sources["log_prefix"] = why
            return True, template, lambda _: (True, True)
    tee = to_map(Std.from_str(args.tee), nproc)

    def prefixed(local_rank: int) -> tuple[bool, bool]:
        std = tee.get(local_rank, Std.NONE)
        return std in (Std.OUT, Std.ALL), std in (Std.ERR, Std.ALL)

    return False, template or TORCHRUN_PREFIX_TEMPLATE, prefixed


def new_log_dir() -> str:
    """The name of a new log directory under the temporary directory (``torchstep-agent-*``);
    nothing is created: the runner creates it (``0700``) when the run starts.

    Returns:
        An absolute path that no one else can have guessed (122 random bits).

    Example: ``os.path.basename(new_log_dir()).startswith("torchstep-agent-")`` is True.
    """
    return os.path.join(tempfile.gettempdir(), f"torchstep-agent-{uuid.uuid4().hex}")


def _rdzv_defaults(backend: str) -> dict[str, str]:
    if backend == "c10d":
        return C10D_RDZV_DEFAULTS
    if backend == "etcd-v2":
        return DYNAMIC_RDZV_DEFAULTS
    return {"last_call_timeout": "1"} if backend == "etcd" else {}


def _logs_specs_factory(name: str | None, args: Any, log_dir: str) -> Callable[[], Any] | None:
    """``--logs-specs NAME``: torchrun's ``torchrun.logs_specs`` entry point, loaded now (an
    unknown name is torchrun's ``ValueError``) and built when called, as torchrun builds it."""
    if not name:
        return None
    from torch.distributed.elastic.multiprocessing import Std

    cls = compat.get_logs_specs_class(name)
    ranks = {int(r) for r in args.local_ranks_filter.split(",")} if args.local_ranks_filter else None
    redirects, tee = Std.from_str(args.redirects), Std.from_str(args.tee)
    return lambda: cls(log_dir=log_dir, redirects=redirects, tee=tee, local_ranks_filter=ranks)


def _check_store_takeover(conf: Mapping[str, Any]) -> None:
    """``store_takeover=on`` needs ``store_candidates``: an agent that replaces the lost store
    host would otherwise host a store of its own at the original endpoint, a second run beside
    the survivors' (torchstep.agent.store_move)."""
    takeover = str(conf.get("store_takeover", "off")).strip().lower() in ("1", "on", "true", "yes")
    if takeover and not str(conf.get("store_candidates", "")).strip():
        raise UsageError(
            "--rdzv-conf store_takeover=on needs store_candidates=<host>|<host>...: the other nodes' "
            "addresses, where an agent started later looks for the moved store (fix: add them, or drop "
            "store_takeover)"
        )
    witness = str(conf.get("store_witness", "off")).strip().lower()
    if witness not in ("kubernetes", "off", "0", "false", "no", ""):
        raise UsageError(
            f"--rdzv-conf store_witness={conf.get('store_witness')}: unknown (fix: store_witness=kubernetes, "
            "the run's Lease in the pod's namespace, or off)"
        )
    if witness == "kubernetes" and not takeover:
        raise UsageError(
            "--rdzv-conf store_witness=kubernetes decides an even split for store_takeover, which is off "
            "(fix: add store_takeover=on,store_candidates=..., or drop store_witness)"
        )


def resolve(argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> AgentSettings:
    """Parse ``argv`` (without the program name) under ``environ`` into settings: each row
    of :data:`~torchstep.agent.settings_table.SETTINGS` by its precedence, then torchrun's
    own rules (``--standalone``, single node), torchstep's pipeline defaults and the
    launcher overrides; :attr:`AgentSettings.sources` says where each value came from.

    Nothing is created or changed: the log directory (a new one when none is given) is
    made by the runner (``runner.prepare_paths``), and :attr:`AgentSettings.process_env`
    is applied by the agent later — except torchrun's own ``OMP_NUM_THREADS=1`` default
    when several workers run, which torch's ``config_from_args`` sets.

    Args:
        argv: the command line without the program name (None: ``sys.argv[1:]``).
        environ: the environment (None: ``os.environ``).

    Returns:
        The settings.

    Raises:
        SystemExit: argparse refused the command line (or ``--help``).
        TorchrunError: torchrun's own checks refused it (exit status 1).
        UsageError: a bad torchstep value (exit status 2).

    Example: ``resolve(["--nnodes", "2", "t.py"], environ={}).config.rdzv_backend`` is ``"c10d"``.
    """
    from torch.distributed.run import parse_min_max_nnodes

    env = os.environ if environ is None else environ
    args = build_parser().parse_args(None if argv is None else list(argv))
    sources: dict[str, str] = {}
    value: dict[str, Any] = {}
    for row in SETTINGS:
        value[row.dest], origin = pick(row, args, env)
        if origin is not None:
            sources[row.dest] = origin
        if not row.flags and row.dest != "zygote":  # a torchrun flag: config_from_args reads it
            setattr(args, row.dest, value[row.dest])

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
    elif max_nodes > 1 and "rdzv_backend" not in sources and "node_rank" not in sources:
        # torch would use static rendezvous with every node claiming node rank 0
        args.rdzv_backend = "c10d"
        if not args.rdzv_endpoint:
            args.rdzv_endpoint = f"{args.master_addr}:{args.master_port or 29500}"
            sources["rdzv_endpoint"] = "default: --master-addr:--master-port"
        sources["rdzv_backend"] = "default: c10d when nnodes > 1"
    if args.master_port is None:
        args.master_port = 29500
    for name, dest in LAUNCHER_OVERRIDES:
        override = read_env(env, name)
        if override is not None:
            setattr(args, dest, override)
            sources[dest] = f"env {name}"
    args.role = args.role or "default"  # TorchX writes `--role ''`

    log_dir = args.log_dir
    if not log_dir or os.path.abspath(log_dir) == os.devnull:
        # kept after the run (never deleted); its path is logged and in the result
        log_dir, sources["log_dir"] = new_log_dir(), "default: new directory"
    log_dir = os.path.abspath(log_dir)
    grace = value["grace_period"]
    args.shutdown_timeout = max(0, round(grace))

    # torch's logs specs create their directory when built: build torchrun's entry point
    # (--logs-specs NAME) later, on the real log dir (logs_specs_factory); here, on none
    specs_name, args.logs_specs, args.log_dir = args.logs_specs, None, os.devnull
    omp_given = "OMP_NUM_THREADS" in os.environ
    try:
        with _no_omp_banner():
            config, entrypoint, entry_args = compat.launch_config_from_args(args)
        if not omp_given and "OMP_NUM_THREADS" in os.environ:
            sources["OMP_NUM_THREADS"] = "torchrun's default with several workers"
        compat.fill_launch_config(config, args)  # fields an older torch lacks: the value it behaves as
        logs_specs = _logs_specs_factory(specs_name, args, log_dir)
        conf = dict(config.rdzv_configs)
        for key, default in _rdzv_defaults(args.rdzv_backend).items():
            if key not in conf:
                conf[key] = default
                sources[f"rdzv_conf.{key}"] = "default"
        launcher_conf = read_env(env, ENV_RDZV_CONF)
        if launcher_conf is not None:
            for key, given in compat.parse_rendezvous_config(launcher_conf).items():
                conf[key] = given
                sources[f"rdzv_conf.{key}"] = f"env {ENV_RDZV_CONF}"
        echo = _echo_filter(args, config.nproc_per_node)
        if config.nproc_per_node < 1:  # torch asserts it later, deep in the agent
            raise AssertionError(f"--nproc-per-node must be at least 1, got {config.nproc_per_node}")
    except (ValueError, AssertionError, RuntimeError) as e:  # torchrun's own checks of its flags
        raise TorchrunError(e) from None
    config.rdzv_configs = conf
    _check_store_takeover(conf)

    process_env = {}
    if ENV_NO_SHARED_STORE not in env:
        process_env[ENV_NO_SHARED_STORE] = "1"
        sources[ENV_NO_SHARED_STORE] = "default: pytorch#135712"
    result_files: list[str] = []
    flag_result = value["result_file"] if sources["result_file"] == "flag" else None
    for path in (flag_result, read_env(env, ENV_RESULT_FILE)):
        # flag and launcher variable both given: write both, so the launcher finds its copy
        if path and os.path.abspath(path) not in result_files:
            result_files.append(os.path.abspath(path))
    merge, template, prefixed = _console_mode(args, env, config.nproc_per_node, sources)
    consumed = [
        ENV_LOG_PREFIX,
        ENV_RUN_DIR,
        ENV_RESULT_FILE,
        ENV_LOG_DIR,
        ENV_RDZV_BACKEND,
        ENV_RDZV_ENDPOINT,
        ENV_RDZV_ID,
        ENV_RDZV_CONF,
        *(row.env for row in SETTINGS if row.flags and row.env != ENV_REPLICA_ID),
    ]
    return AgentSettings(
        config=config,
        entrypoint=entrypoint,
        entry_args=list(entry_args),
        role=args.role,
        app_id=read_env(env, ENV_APP_ID) or config.run_id,
        replica_id=value["replica_id"],
        log_dir=log_dir,
        result_files=result_files,
        heartbeat_timeout=value["heartbeat_timeout"],
        hang_timeout=value["hang_timeout"],
        grace_period=grace,
        stop_timeout=value["stop_timeout"],
        exit_barrier_timeout=value["exit_barrier_timeout"],
        watchdog_timeout=value["watchdog_timeout"],
        echo_ranks=echo,
        prefix_template=template,
        process_env=process_env,
        consumed_env=sorted(set(consumed)),
        sources=sources,
        run_dir_parent=read_env(env, ENV_RUN_DIR) or None,
        prefixed=prefixed,
        merge_streams=merge,
        custom_logs_specs=logs_specs is not None,
        logs_specs_factory=logs_specs,
        zygote=value["zygote"],
    )


class _OmpBanner(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "OMP_NUM_THREADS" not in record.getMessage()


@contextmanager
def _no_omp_banner() -> Iterator[None]:
    """torchrun's 4-line banner that it set ``OMP_NUM_THREADS=1`` is left out: every agent
    of a step would print it into the orchestrator's log (Airflow, Prefect, every pod); the
    value stays, and the detailed settings say where it came from."""
    banner, logger = _OmpBanner(), logging.getLogger("torch.distributed.run")
    logger.addFilter(banner)
    try:
        yield
    finally:
        logger.removeFilter(banner)
