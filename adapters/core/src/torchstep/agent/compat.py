"""Every private name of torch that the agent uses, in one place.

The agent runs in the user's step image on the user's torch (2.4 … newest): a private name
that moves or disappears in some version must break in this module only, where each use
says which torch versions it was checked on and what happens without it.

Example::

    >>> from torchstep.agent import compat
    >>> compat.RDZV_STATE_CLASS
    '_RendezvousState'
"""

from __future__ import annotations

import sys
from typing import Any

# ---------------------------------------------------------------------------------------
# Rendezvous state guard (torchstep.agent.rdzv_guard)
#
# torch's dynamic rendezvous pickles its state into the store. These are the classes a
# genuine state is made of and where the handler keeps its backend; checked on torch 2.4.1,
# 2.6.0, 2.13.0 and 2.15.0 (unchanged since 1.9). Without them the guard is not installed
# and the agent says so.
# ---------------------------------------------------------------------------------------

#: Module of the rendezvous state classes.
RDZV_STATE_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
#: The state's class (a plain class with a ``__dict__``).
RDZV_STATE_CLASS = "_RendezvousState"
#: A node's description (a frozen dataclass: addr, pid, local_id).
RDZV_NODE_CLASS = "_NodeDesc"


def _dynamic_rendezvous() -> Any:
    import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dr

    return dr


def rdzv_state_class() -> type:
    """torch's ``_RendezvousState`` class.

    Returns:
        The class.
    """
    cls: type = getattr(_dynamic_rendezvous(), RDZV_STATE_CLASS)
    return cls


def rdzv_node_class() -> type:
    """torch's ``_NodeDesc`` class.

    Returns:
        The class.
    """
    cls: type = getattr(_dynamic_rendezvous(), RDZV_NODE_CLASS)
    return cls


def rendezvous_state_error() -> type[Exception]:
    """torch's ``RendezvousStateError`` (a ``RendezvousError``: the agent's run fails as a
    rendezvous failure).

    Returns:
        The exception class.
    """
    from torch.distributed.elastic.rendezvous import RendezvousStateError

    return RendezvousStateError


def rdzv_backend_of(handler: Any) -> Any:
    """The backend of a dynamic rendezvous handler (``handler._state_holder._backend``).

    Args:
        handler: a rendezvous handler.

    Returns:
        The backend, or ``None`` for handlers without one (static, etcd v1).
    """
    holder = getattr(handler, "_state_holder", None)
    return getattr(holder, "_backend", None)


def set_rdzv_backend(handler: Any, backend: Any) -> bool:
    """Replace the backend a dynamic rendezvous handler's state holder syncs through.

    Args:
        handler: a rendezvous handler that has one (:func:`rdzv_backend_of`).
        backend: the new backend.

    Returns:
        ``True`` when it was replaced.
    """
    holder = getattr(handler, "_state_holder", None)
    if holder is None or not hasattr(holder, "_backend"):
        return False
    holder._backend = backend
    return True


# ---------------------------------------------------------------------------------------
# Liveness (torchstep.agent.liveness): a second, bounded view of the rendezvous state.
#
#   handler._this_node, handler._settings: this node's description and the rendezvous
#   settings; dynamic_rendezvous._BackendRendezvousStateHolder: reads and writes the state
#   through a backend (the monitor's own, on its own store connection);
#   dynamic_rendezvous._remove_participant_epilogue: what torch does after removing a
#   participant (a round left empty moves on). All present on torch 2.4 … 2.15 (checked 2.13);
#   a torch without one of them runs without the monitor (one log line).
#   DynamicRendezvousHandler._stop_heartbeats and its instance __dict__ (the store moved to
#   a survivor, torchstep.agent.store_move): the handler torch's loop holds takes a new
#   handler's state; a torch without them fails the move (the run fails, retryable).
# ---------------------------------------------------------------------------------------


def rdzv_node_and_settings(handler: Any) -> tuple[Any, Any] | None:
    """This node's description and the rendezvous settings of a dynamic handler.

    Args:
        handler: a rendezvous handler.

    Returns:
        ``(node, settings)``; ``None`` for handlers without them (static, etcd v1).
    """
    node = getattr(handler, "_this_node", None)
    settings = getattr(handler, "_settings", None)
    if node is None or settings is None or not hasattr(settings, "keep_alive_interval"):
        return None
    return node, settings


def rdzv_round(handler: Any) -> int | None:
    """The round of the rendezvous state a dynamic handler last read.

    Args:
        handler: a rendezvous handler.

    Returns:
        The round, or ``None`` for handlers without one.
    """
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    value = getattr(state, "round", None)
    return int(value) if isinstance(value, int) else None


def rdzv_state_holder(backend: Any, settings: Any) -> Any:
    """A state holder of torch's dynamic rendezvous over ``backend``, without a read cache.

    Args:
        backend: a rendezvous backend (``get_state``/``set_state``).
        settings: the rendezvous settings (its dead-node expiry is the handler's own).

    Returns:
        The holder (``sync()``, ``state``, ``mark_dirty()``), or ``None`` on a torch without one.
    """
    cls = getattr(_dynamic_rendezvous(), "_BackendRendezvousStateHolder", None)
    if cls is None:
        return None
    return cls(backend, settings, cache_duration=0)


def rdzv_participants(handler: Any) -> dict[Any, int]:
    """The participants of the round a dynamic handler last read, with their group ranks.

    Args:
        handler: a rendezvous handler.

    Returns:
        ``{node: rank}``; empty for handlers without a state.
    """
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    participants = getattr(state, "participants", None)
    return dict(participants) if isinstance(participants, dict) else {}


def replace_rdzv_handler(handler: Any, new: Any) -> bool:
    """Make ``handler`` the handler ``new`` is (its store, backend, state, node, settings),
    its own keep-alive heartbeats stopped first (torch's ``_stop_heartbeats``). The object
    stays the same: torch's agent loop holds it (:mod:`torchstep.agent.store_move`).

    Args:
        handler: a dynamic rendezvous handler.
        new: a handler of the same class, built on the new store.

    Returns:
        ``False`` (nothing changed) when they are not dynamic handlers of one class.
    """
    if type(new) is not type(handler) or rdzv_node_and_settings(handler) is None:
        return False
    stop = getattr(handler, "_stop_heartbeats", None)
    if callable(stop):
        stop()
    handler.__dict__.clear()
    handler.__dict__.update(new.__dict__)
    return True


def remove_rdzv_node(state: Any, node: Any, settings: Any) -> bool:
    """Remove ``node`` from a rendezvous state as torch removes a node whose heartbeat
    expired (participants, heartbeats, wait and redundancy lists; an emptied complete round
    moves on).

    Args:
        state: the state (changed in place).
        node: the node's description.
        settings: the rendezvous settings.

    Returns:
        Whether the state changed.
    """
    changed = state.last_heartbeats.pop(node, None) is not None
    removed = state.participants.pop(node, None) is not None
    for name in ("wait_list", "redundancy_list"):
        members = getattr(state, name, None)
        if members is not None and node in members:
            members.discard(node)
            changed = True
    if removed:
        epilogue = getattr(_dynamic_rendezvous(), "_remove_participant_epilogue", None)
        if epilogue is not None:
            epilogue(state, settings)
    return changed or removed


# ---------------------------------------------------------------------------------------
# The supported torch range (torchstep.agent.cli checks it before anything imports torch)
#
# The oldest is 2.4: LogsSpecs (torchrun's --logs-specs, the agent's per-rank logs) came in
# 2.3, and 2.4 is the oldest release the torch matrix runs; docs/agent.md says why.
# A newer torch than the newest checked runs (every private name below is detected, not
# assumed); the settings line says it is newer than the checked range.
# ---------------------------------------------------------------------------------------

#: The oldest torch the agent runs on (major, minor).
OLDEST_TORCH = (2, 4)
#: The newest torch release the agent was checked on (major, minor).
NEWEST_CHECKED_TORCH = (2, 15)


def _release(version: str) -> tuple[int, ...]:
    """``"2.6.0+cu124"`` -> ``(2, 6, 0)``; ``"2.16.0a0"`` -> ``(2, 16, 0)``."""
    import re

    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def installed_torch() -> str | None:
    """The installed torch's version, read from its distribution's metadata (torch is not
    imported), or None when torch is not installed.

    Returns:
        e.g. ``"2.6.0+cu124"``, or None.
    """
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def supported_range() -> str:
    """The supported range in words, e.g. ``"torch 2.4 or newer (checked up to 2.15)"``."""
    oldest = ".".join(map(str, OLDEST_TORCH))
    newest = ".".join(map(str, NEWEST_CHECKED_TORCH))
    return f"torch {oldest} or newer (checked up to {newest})"


def torch_refusal(version: str | None) -> str:
    """Why the agent cannot run on torch ``version`` ("" when it can): one line naming the
    installed torch and the supported range.

    Args:
        version: :func:`installed_torch`.

    Returns:
        The line, or "".

    Example: ``torch_refusal("2.3.1")`` is ``"torch 2.3.1 is installed; torchstep-agent needs
    torch 2.4 or newer (checked up to 2.15): pip install 'torch>=2.4'"``.
    """
    oldest = ".".join(map(str, OLDEST_TORCH))
    fix = f"pip install 'torch>={oldest}'"
    if version is None:
        return f"torch is not installed; torchstep-agent needs {supported_range()}: {fix}"
    if _release(version)[:2] < OLDEST_TORCH:
        return f"torch {version} is installed; torchstep-agent needs {supported_range()}: {fix}"
    return ""


def newer_than_checked(version: str | None) -> str:
    """A note for the settings line when ``version`` is newer than the newest checked
    release ("" otherwise): it runs, by feature detection.

    Args:
        version: :func:`installed_torch`.

    Returns:
        e.g. ``"torch 2.16.0 is newer than the newest checked (2.15)"``, or "".
    """
    if version is None or _release(version)[:2] <= NEWEST_CHECKED_TORCH:
        return ""
    return f"torch {version} is newer than the newest checked ({'.'.join(map(str, NEWEST_CHECKED_TORCH))})"


# ---------------------------------------------------------------------------------------
# torchrun's parser and LaunchConfig (torchstep.agent.settings)
#
# config_from_args, get_args_parser and parse_min_max_nnodes are public; these are not:
#   _get_logs_specs_class (torch.distributed.run)            --logs-specs NAME
#   _parse_rendezvous_config (…rendezvous.utils)             "k=v,k=v"
#   _utils_internal.get_default_numa_options                 2.11 …: see launch_config_from_args
# (checked, unchanged, on 2.4.1, 2.6.0, 2.11.0, 2.13.0 and 2.15.0, as every name below)
# Flags that only newer torchruns have (--shutdown-timeout: not in 2.11, in 2.13;
# --signals-to-handle, --numa-binding, --duplicate-*-filters, --virtual-local-rank,
# --event-log-handler: not in 2.6, in 2.11) are refused by the user's torchrun parser exactly
# as that torchrun refuses them (a row of SETTINGS whose flag this torchrun lacks counts as
# not given); LaunchConfig fields the user's torch lacks get the value that torch behaves as
# (fill_launch_config).
# ---------------------------------------------------------------------------------------


def get_logs_specs_class(name: str) -> Any:
    """torchrun's ``--logs-specs NAME`` lookup (an unknown name: torchrun's ``ValueError``).

    Args:
        name: the ``torchrun.logs_specs`` entry point's name.

    Returns:
        The ``LogsSpecs`` class.
    """
    from torch.distributed.run import _get_logs_specs_class

    return _get_logs_specs_class(name)


def parse_rendezvous_config(text: str) -> dict[str, str]:
    """torch's ``--rdzv-conf`` parser (``"k=v,k2=v2"``; a bad one: its ``ValueError``).

    Args:
        text: the configuration string.

    Returns:
        The key/value pairs.
    """
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    return dict(_parse_rendezvous_config(text))


#: LaunchConfig fields of newer torches and the value the older ones behave as.
LAUNCH_CONFIG_DEFAULTS: dict[str, Any] = {
    "event_log_handler": "null",
    "numa_options": None,
    "signals_to_handle": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",  # what torch 2.4/2.6 handle, fixed
    "duplicate_stdout_filters": None,
    "duplicate_stderr_filters": None,
    "virtual_local_rank": False,
    "shutdown_timeout": 30,  # torch 2.4-2.11: SIGTERM -> SIGKILL after a signal, fixed
}


def _numa_probe_is_idle() -> bool:
    """Whether torch's LaunchConfig asks the accelerator for its device count only to pick
    default NUMA options that are None anyway (every OSS build: ``get_default_numa_options``
    is a hook for Meta's internal one)."""
    import dataclasses

    from torch.distributed.launcher.api import LaunchConfig

    if "numa_options" not in {f.name for f in dataclasses.fields(LaunchConfig)}:
        return False  # torch 2.4/2.6: no probe at all
    try:
        from torch._utils_internal import get_default_numa_options

        return get_default_numa_options() is None
    except Exception:  # moved or raising: leave torch's probe as it is
        return False


def launch_config_from_args(args: Any) -> tuple[Any, Any, list[str]]:
    """torch's ``config_from_args`` without its accelerator probe where the probe can change
    nothing.

    torch's ``LaunchConfig.__post_init__`` (2.11 …; not 2.6) calls ``torch.cuda.is_available()``
    (2.15: ``torch.accelerator.is_available()``) and ``device_count()`` to pick default NUMA
    options. On a CUDA build that is ``cudaGetDeviceCount``: it initialises the CUDA driver
    where there is one and, GPU or not, registers torch's fork handler, so every process
    forked from the agent afterwards (the worker zygote) is a "bad fork" that may not use
    CUDA. OSS torch's default NUMA options are None whatever the answer, so the probe is
    skipped there (same config); elsewhere torch's own probe runs.

    Args:
        args: torchrun's parsed arguments.

    Returns:
        ``(config, entrypoint, entry_args)`` as ``config_from_args`` returns them.
    """
    import torch.distributed.run as run

    if not _numa_probe_is_idle():
        return run.config_from_args(args)  # type: ignore[no-any-return]
    base = run.LaunchConfig
    unset = object()

    class _Unprobed(base):  # type: ignore[valid-type, misc]
        def __post_init__(self) -> None:
            me: Any = self
            probe = me.numa_options is None
            if probe:
                me.numa_options = unset  # torch probes only when it is None
            try:
                super().__post_init__()
            finally:
                if probe and me.numa_options is unset:
                    me.numa_options = None

    run.LaunchConfig = _Unprobed  # type: ignore[misc]
    try:
        return run.config_from_args(args)  # type: ignore[no-any-return]
    finally:
        run.LaunchConfig = base  # type: ignore[misc]


def fill_launch_config(config: Any, args: Any) -> list[str]:
    """Give ``config`` every field of :data:`LAUNCH_CONFIG_DEFAULTS` the user's torch lacks,
    so the agent reads one shape on every torch: the agent's own value where it has one in
    ``args`` (``shutdown_timeout``: its grace period, which :meth:`torch_shutdown` applies
    on every torch; ``signals_to_handle``: the signals it handles itself), else the value
    that torch behaves as.

    Args:
        config: torch's ``LaunchConfig``.
        args: the parsed command line, with the agent's values set.

    Returns:
        The fields that were missing.
    """
    missing = [name for name in LAUNCH_CONFIG_DEFAULTS if not hasattr(config, name)]
    for name in missing:
        setattr(config, name, getattr(args, name, LAUNCH_CONFIG_DEFAULTS[name]))
    return missing


def worker_spec(**fields: Any) -> Any:
    """torch's ``WorkerSpec`` from ``fields``; those the user's torch lacks are set on the
    spec afterwards (torch ignores them; their values are that torch's behaviour:
    :data:`LAUNCH_CONFIG_DEFAULTS`).

    Args:
        fields: ``WorkerSpec`` fields.

    Returns:
        The spec.

    Raises:
        ValueError: a field this torch lacks has a value other than the default.
    """
    import dataclasses

    from torch.distributed.elastic.agent.server.api import WorkerSpec

    known = {f.name for f in dataclasses.fields(WorkerSpec)}
    extra = {name: fields.pop(name) for name in [n for n in fields if n not in known]}
    for name, value in extra.items():
        if value != LAUNCH_CONFIG_DEFAULTS.get(name, value):
            raise ValueError(f"{name}={value!r} needs a newer torch (this torch's WorkerSpec has no {name})")
    spec = WorkerSpec(**fields)
    for name, value in extra.items():  # read by the agent as on a newer torch
        setattr(spec, name, value)
    return spec


def logs_dest(**fields: Any) -> Any:
    """torch's ``LogsDest`` from ``fields``, leaving out those the user's torch lacks
    (``filtered_stdout`` / ``filtered_stderr``: not in 2.6, in 2.11, with ``--duplicate-*-filters``).

    Args:
        fields: ``LogsDest`` fields.

    Returns:
        The ``LogsDest``.
    """
    import dataclasses

    from torch.distributed.elastic.multiprocessing.api import LogsDest

    known = {f.name for f in dataclasses.fields(LogsDest)}
    return LogsDest(**{k: v for k, v in fields.items() if k in known})


# ---------------------------------------------------------------------------------------
# torch.distributed.launcher.api and the rendezvous handler (torchstep.agent.runner)
#
#   _get_addr_and_port, _get_entrypoint_name
#   DynamicRendezvousHandler._settings / _state_holder._settings / _op_executor._settings
#     (a frozen RendezvousSettings): the sub-second keep-alive tick
# ---------------------------------------------------------------------------------------


def addr_and_port(params: Any) -> tuple[Any, Any]:
    """The master address and port ``launch_agent`` derives from the rendezvous parameters.

    Args:
        params: torch's ``RendezvousParameters``.

    Returns:
        ``(master_addr, master_port)`` (both None for a dynamic rendezvous).
    """
    from torch.distributed.launcher.api import _get_addr_and_port

    return _get_addr_and_port(params)


def entrypoint_name(entrypoint: Any, args: list[str]) -> str:
    """The name torchrun's failure report gives the entrypoint.

    Args:
        entrypoint: a binary path or a function.
        args: its arguments.

    Returns:
        The name.
    """
    from torch.distributed.launcher.api import _get_entrypoint_name

    return str(_get_entrypoint_name(entrypoint, args))


def set_keep_alive(handler: Any, period_s: float) -> bool:
    """Give a dynamic rendezvous handler a keep-alive tick of ``period_s`` (torch parses
    ``keep_alive_interval`` as whole seconds). Every holder of the handler's settings gets
    the same new object, so the heartbeat period and the dead-node expiry agree.

    Args:
        handler: a rendezvous handler.
        period_s: the tick in seconds.

    Returns:
        ``False`` (and nothing changed) for handlers without these settings (static, etcd).
    """
    import dataclasses
    from datetime import timedelta

    settings = getattr(handler, "_settings", None)
    if settings is None or not hasattr(settings, "keep_alive_interval"):
        return False
    new = dataclasses.replace(settings, keep_alive_interval=timedelta(seconds=period_s))
    for owner in (handler, getattr(handler, "_state_holder", None), getattr(handler, "_op_executor", None)):
        if owner is not None and getattr(owner, "_settings", None) is settings:
            owner._settings = new
    return True


def _method_name(depth: int = 2) -> str:
    """``inspect.stack()[depth].function`` without building the stack: frame ``depth`` counted
    from this function's own, as torch counts from ``get_method_name``'s."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a shallower stack: torch's answer then
        return "no_method_name"


def quicken_rendezvous(*, single_node: bool) -> list[str]:
    """Take two costs out of torch's dynamic rendezvous that buy this agent nothing; the
    rendezvous itself is unchanged.

    - ``dynamic_rendezvous.get_method_name`` names each rendezvous event with
      ``inspect.stack()``, twice per event: every frame's source file is read and every
      loaded module's path resolved (torch 2.4.1: 9 calls and 40 ms in one round on this
      machine's 2 cores, before the event is dropped by the default null handler). Replaced
      by the same name read from the frame itself.
    - ``dynamic_rendezvous._delay`` with a range is a random wait, 0-0.3 s before a node's
      first round (all versions) and a compare-and-set back-off (2.15), that skews the joins
      of many nodes on one store. With one node (``--nnodes 1``, the single-node default)
      there is nobody to skew against: the wait is skipped. A fixed delay (the 1 s pause
      while a round waits for nodes) stays.

    Checked on torch 2.4.1, 2.6.0, 2.11.0, 2.13.0 and 2.15.0 (2.6.0 and 2.11.0 from their
    wheels' sources), where both are module globals of
    ``torch.distributed.elastic.rendezvous.dynamic_rendezvous`` looked up at each call.
    Without either, nothing changes.

    Args:
        single_node: whether this rendezvous has at most one node.

    Returns:
        The names replaced (``[]`` when this torch has neither), for the tests.
    """
    dr = _dynamic_rendezvous()
    replaced = []
    current = getattr(dr, "get_method_name", None)
    if callable(current) and current is not _method_name:
        dr.get_method_name = _method_name
        replaced.append("get_method_name")
    delay = getattr(dr, "_delay", None)
    if single_node and callable(delay) and not getattr(delay, "torchstep", False):

        def _delay(seconds: float | tuple[float, float]) -> None:
            if isinstance(seconds, tuple):  # a random skew between nodes: there is one
                return
            delay(seconds)

        _delay.torchstep = True  # type: ignore[attr-defined]
        dr._delay = _delay
        replaced.append("_delay")
    return replaced


# ---------------------------------------------------------------------------------------
# Signals (torchstep.agent.signals)
#
#   torch.distributed.elastic.multiprocessing.api._terminate_process_handler:
#   raises SignalException, which torch's agent loop and the runner turn into a cancel.
# ---------------------------------------------------------------------------------------


def terminate_process_handler(signum: int, frame: Any) -> None:
    """torch's own handler of a handled signal: raises ``SignalException``.

    Args:
        signum: the signal.
        frame: the interrupted frame.
    """
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    _terminate_process_handler(signum, frame)


# ---------------------------------------------------------------------------------------
# Accelerator state before a fork (torchstep.agent.forksafe: the worker zygote)
#
#   torch.cuda/xpu/mtia._is_in_bad_fork (cuda: every checked torch): this process
#   is a fork of one whose accelerator was initialised or probed (torch refuses it here).
#   torch._C._get_privateuse1_backend_name (every checked torch): an out-of-tree backend's name.
# ---------------------------------------------------------------------------------------


def in_bad_fork(module: Any) -> bool:
    """Whether torch's accelerator ``module`` (``torch.cuda``...) says this process is a fork
    of one that had it initialised or probed; False where the module has no such flag.

    Args:
        module: an accelerator module, or None.

    Returns:
        The flag.
    """
    probe = getattr(module, "_is_in_bad_fork", None)
    return bool(callable(probe) and probe())


def privateuse1_backend(torch: Any) -> str | None:
    """The name of an out-of-tree accelerator backend registered with torch (``npu``...),
    None when there is none or this torch cannot say.

    Args:
        torch: the imported ``torch`` module.

    Returns:
        The name, or None.
    """
    try:
        name = torch._C._get_privateuse1_backend_name()
    except Exception:
        return None
    return str(name) if name != "privateuseone" else None


# ---------------------------------------------------------------------------------------
# The elastic agent (torchstep.agent.elastic)
#
# TorchstepAgent extends torch's LocalElasticAgent at its private hooks. agent_base()
# returns a subclass that receives each hook torch calls and forwards it to a public
# method (the subclass overrides those), and offers torch's own step as ``torch_<name>``:
#
#   torch calls            forwarded to            torch's own
#   _rendezvous            rendezvous_group        torch_rendezvous
#   _setup_local_watchdog  prepare_workers         torch_setup_local_watchdog
#   _start_workers         start_group             torch_start_workers
#   _monitor_workers       monitor_group           torch_monitor_workers
#   _stop_workers          stop_group              -                          (2.4/2.6: is_restart)
#   _shutdown              shutdown_group          torch_shutdown             (2.4-2.11: no timeout)
#   _restart_workers       restart_group           torch_restart_workers
#   _exit_barrier          exit_barrier_wait       torch_exit_barrier
# and run_loop / record_run / remaining_restarts / process_context / exit_barrier_timeout_s
# for torch's _invoke_run, _record_metrics + _record_worker_events + _total_execution_time,
# _remaining_restarts, _pcontext and _exit_barrier_timeout.
#
# _shutdown's signature: 2.4.1/2.6.0 (death_sig, is_restart), 2.11.0 (death_sig), 2.13.0/
# 2.15.0 (death_sig, timeout). Without a timeout it closes the process context with torch's
# fixed 30 s and, with is_restart=False, the rendezvous too: torch_shutdown passes the
# agent's timeout to the process context itself and leaves the rendezvous to the runner,
# as 2.13 does.
# ---------------------------------------------------------------------------------------


def _accepts(func: Any, name: str) -> bool:
    import inspect

    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


def shutdown_has_timeout() -> bool:
    """Whether the user's torch's ``LocalElasticAgent._shutdown`` takes a timeout (2.13 …).

    Returns:
        The answer.
    """
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    return _accepts(LocalElasticAgent._shutdown, "timeout")


def worker_returncode(pcontext: Any, local_rank: int) -> int | None:
    """A worker's exit code as torch's process context has it (None: running or unknown).

    Args:
        pcontext: torch's ``PContext`` (subprocesses: ``subprocess_handlers``; functions:
            ``MultiprocessContext._pc.processes``).
        local_rank: the worker.

    Returns:
        The exit code, or None.
    """
    if pcontext is None:
        return None
    handlers = getattr(pcontext, "subprocess_handlers", None)
    if handlers and local_rank in handlers:
        code: int | None = handlers[local_rank].proc.poll()
        return code
    procs = getattr(getattr(pcontext, "_pc", None), "processes", None)
    if procs and local_rank < len(procs):
        exitcode: int | None = procs[local_rank].exitcode
        return exitcode
    return None


_AGENT_BASE: Any = None


def agent_base() -> Any:
    """torch's ``LocalElasticAgent`` seen through public names (see the table above); built
    on first use, so importing this module does not import torch.

    Returns:
        The class to subclass.
    """
    global _AGENT_BASE
    if _AGENT_BASE is None:
        _AGENT_BASE = _build_agent_base()
    return _AGENT_BASE


def _build_agent_base() -> Any:
    import signal

    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    has_timeout = _accepts(LocalElasticAgent._shutdown, "timeout")
    has_is_restart = _accepts(LocalElasticAgent._shutdown, "is_restart")
    init_takes_timeout = _accepts(LocalElasticAgent.__init__, "shutdown_timeout")

    class AgentBase(LocalElasticAgent):
        """``LocalElasticAgent`` with public hooks (torchstep.agent.compat)."""

        def __init__(
            self,
            spec: Any,
            logs_specs: Any,
            *,
            start_method: str,
            exit_barrier_timeout: float,
            shutdown_timeout: int,
        ) -> None:
            kw: dict[str, Any] = {"shutdown_timeout": shutdown_timeout} if init_takes_timeout else {}
            super().__init__(
                spec,
                logs_specs,
                start_method=start_method,
                exit_barrier_timeout=exit_barrier_timeout,
                log_line_prefix_template=None,  # the agent's LogTee prefixes the console copy
                **kw,
            )

        # -- what torch calls ----------------------------------------------------------
        def _rendezvous(self, worker_group: Any) -> None:
            self.rendezvous_group(worker_group)

        def _setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
            # torch calls it from _start_workers with each worker's environment, just
            # before the processes start
            self.prepare_workers(envs)

        def _start_workers(self, worker_group: Any) -> dict[int, Any]:
            return self.start_group(worker_group)  # type: ignore[no-any-return]

        def _monitor_workers(self, worker_group: Any) -> Any:
            return self.monitor_group(worker_group)

        def _stop_workers(self, worker_group: Any, *_: Any, **__: Any) -> None:
            self.stop_group(worker_group)

        def _shutdown(self, death_sig: Any = signal.SIGTERM, *_: Any, timeout: Any = None, **__: Any) -> None:
            self.shutdown_group(death_sig, 30 if timeout is None else timeout)

        def _restart_workers(self, worker_group: Any) -> None:
            self.restart_group(worker_group)

        def _exit_barrier(self) -> None:
            self.exit_barrier_wait()

        # -- torch's own steps ---------------------------------------------------------
        def torch_rendezvous(self, worker_group: Any) -> None:
            super()._rendezvous(worker_group)

        def torch_setup_local_watchdog(self, envs: dict[int, dict[str, str]]) -> None:
            super()._setup_local_watchdog(envs)

        def torch_start_workers(self, worker_group: Any) -> dict[int, Any]:
            return super()._start_workers(worker_group)  # type: ignore[no-any-return]

        def torch_monitor_workers(self, worker_group: Any) -> Any:
            return super()._monitor_workers(worker_group)

        def torch_shutdown(self, death_sig: Any, timeout: float) -> None:
            if has_timeout:
                super()._shutdown(death_sig, timeout)  # type: ignore[arg-type]
                return
            pc: Any = self._pcontext
            close: Any = pc.close if pc is not None else None
            if pc is not None:  # this torch closes with its fixed 30 s: pass the agent's
                pc.close = lambda sig=None, _t=30: close(sig, timeout)
            try:
                if has_is_restart:  # 2.4/2.6: is_restart=False would close the rendezvous (the runner does)
                    super()._shutdown(death_sig, is_restart=True)  # type: ignore[call-arg]
                else:
                    super()._shutdown(death_sig)
            finally:
                if pc is not None:
                    pc.close = close

        def torch_restart_workers(self, worker_group: Any) -> None:
            super()._restart_workers(worker_group)

        def torch_exit_barrier(self) -> None:
            super()._exit_barrier()

        # -- the hooks (default: torch's) ----------------------------------------------
        def rendezvous_group(self, worker_group: Any) -> None:
            self.torch_rendezvous(worker_group)

        def prepare_workers(self, envs: dict[int, dict[str, str]]) -> None:
            self.torch_setup_local_watchdog(envs)

        def start_group(self, worker_group: Any) -> dict[int, Any]:
            return self.torch_start_workers(worker_group)

        def monitor_group(self, worker_group: Any) -> Any:
            return self.torch_monitor_workers(worker_group)

        def stop_group(self, worker_group: Any) -> None:
            self.shutdown_group(signal.SIGTERM, 30)

        def shutdown_group(self, death_sig: Any, timeout: float) -> None:
            self.torch_shutdown(death_sig, timeout)

        def restart_group(self, worker_group: Any) -> None:
            self.torch_restart_workers(worker_group)

        def exit_barrier_wait(self) -> None:
            self.torch_exit_barrier()

        # -- torch's state, by public names --------------------------------------------
        def run_loop(self, role: str) -> Any:
            """torch's elastic loop (``_invoke_run``): rendezvous, start, monitor, restart."""
            return self._invoke_run(role)

        def record_run(self, result: Any, elapsed_s: float) -> None:
            """What torch's ``run`` records after the loop (metrics, worker events)."""
            self._total_execution_time = int(elapsed_s)
            self._record_metrics(result)
            self._record_worker_events(result)

        def set_elapsed(self, elapsed_s: float) -> None:
            """The run's duration as torch's events report it."""
            self._total_execution_time = int(elapsed_s)

        @property
        def remaining_restarts(self) -> int:
            return int(self._remaining_restarts)

        @remaining_restarts.setter
        def remaining_restarts(self, value: int) -> None:
            self._remaining_restarts = value

        @property
        def process_context(self) -> Any:
            """torch's ``PContext`` of the running group (None between groups)."""
            return self._pcontext

        @property
        def current_group(self) -> Any:
            """The ``WorkerGroup`` torch is running."""
            return self._worker_group

        @property
        def exit_barrier_timeout_s(self) -> float:
            return float(self._exit_barrier_timeout)

    return AgentBase
