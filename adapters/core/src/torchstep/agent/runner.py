"""One run of the agent: rendezvous handler, worker spec, :class:`TorchstepAgent`, the
reaper, the watchdog and the result file — torch's ``launch_agent`` with every exit path
turned into an :class:`~torchstep.agent.outcome.Outcome`.

Example::

    prepare_paths(settings)          # creates the log directory (resolve creates nothing)
    run = AgentRun(settings, started_at=time.time())
    outcome = run.execute()          # never raises for worker / rendezvous failures
    result = run.finish(outcome)     # writes the result everywhere, stops the helpers
    sys.exit(result.exit_code)
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

from torchstep.agent import compat, signals
from torchstep.agent.outcome import Outcome, build_result, result_paths, running_result, write_all
from torchstep.agent.procs import EXEC_WRAPPER, ExitWatcher, OrphanSweeper, Reaper, become_subreaper
from torchstep.agent.settings import KEEP_ALIVE_PERIOD_S, AgentSettings, UsageError
from torchstep.agent.watchdog import ProgressWatchdog
from torchstep.errors import AGENT_ERROR_EXIT_CODE
from torchstep.files import UnsafePathError, private_dir, private_root
from torchstep.result import GRACEFUL_EXIT_MESSAGE, StepResult

log = logging.getLogger("torchstep.agent")


def prepare_paths(settings: AgentSettings) -> None:
    """Create what the settings name, before anything starts (``resolve`` creates nothing):
    the log directory (``0700`` when new, kept after the run) and each result file's
    parent; then check that every result file can be written, since a result that could
    not be written later would be lost silently.

    Args:
        settings: the resolved settings.

    Raises:
        UsageError: the log directory is a symlink, not ours, open to others or not
            writable (``--log-dir ...``), or a result file cannot be written
            (``--result-file ...``): the agent exits with 2.

    Example: ``prepare_paths(resolve(["t.py"]))`` creates the new ``torchstep-agent-*`` log directory.
    """
    try:  # a private directory of ours: created 0700 when missing, a symlink or foreign dir refused
        private_root(settings.log_dir)
    except UnsafePathError as e:
        raise UsageError(f"--log-dir {e}") from None
    for path in settings.result_files:
        parent = os.path.dirname(path) or "."
        try:
            if not os.path.isdir(parent):
                private_dir(parent)
            if os.path.isdir(path) or os.path.islink(path):
                raise UnsafePathError(path, "is a directory or a symlink", "name a file path")
            if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
                raise UnsafePathError(path, "is not writable", "choose a path you can write")
        except UnsafePathError as e:
            raise UsageError(f"--result-file {e}") from None


class AgentRun:
    """See the module docstring.

    Example: ``AgentRun(settings, started_at=time.time()).result_paths`` lists
    ``--result-file``, ``TORCHSTEP_RESULT_FILE`` and ``<log-dir>/result.json`` (each once).
    """

    def __init__(
        self, settings: AgentSettings, *, started_at: float, zygote: Any = None, warnings: list[str] | None = None
    ) -> None:
        self.settings = settings
        self.started_at = started_at
        self.result_paths = result_paths(settings)
        #: What went wrong beside the outcome (logs a full disk truncated...): the result's
        #: ``warnings``. Shared with the CLI (agent.log) and the agent (rank logs).
        self.warnings: list[str] = warnings if warnings is not None else []
        # FIFO, heartbeats: not logs. Under the launcher's directory when it gives one (it
        # removes it at its end, whatever killed us); mkdtemp makes it 0700
        parent = settings.run_dir_parent
        self.run_dir = tempfile.mkdtemp(
            prefix="torchstep-run-", dir=parent if parent and os.path.isdir(parent) else None
        )
        self.reaper = Reaper(results=self.result_paths, run_dir=self.run_dir)
        self.exits = ExitWatcher()
        self.orphans = OrphanSweeper(self.reaper, self.exits)
        self.watchdog = ProgressWatchdog(
            settings.watchdog_timeout, on_fire=self._on_watchdog, any_alive=self._any_alive
        )
        self.agent: Any = None
        self.zygote: Any = None
        self._prestarted = zygote  # the ZygoteProcess the CLI forked once torch was imported
        self._write_lock = threading.Lock()
        self._final = False
        self.unwritten: dict[str, str] = {}  # result paths the last write could not write: why
        self._failures: dict[int, Any] = {}  # torch's failures of the last attempt (global rank -> failure)

    # -- result file -------------------------------------------------------------------------
    def write(self, result: StepResult, *, final: bool) -> bool:
        with self._write_lock:
            if self._final:
                return False
            failed = write_all(result, self.result_paths)
            for path, why in failed.items():
                if path not in self.unwritten:  # once per path, not at every write
                    log.error("cannot write the result to %s: %s", path, why)
            self.unwritten = failed
            self._final = final
            return True

    def _warn(self, text: str) -> None:
        if self.agent is not None:
            self.agent.warn(text)
        elif text not in self.warnings:
            self.warnings.append(text)
            log.warning("%s", text)

    def _build(self, outcome: Outcome, *, full: bool = True) -> StepResult:
        agent = self.agent if full else None
        return build_result(self.settings, agent, outcome, started_at=self.started_at, warnings=self.warnings)

    def _any_alive(self) -> bool:
        return self.agent is not None and self.agent.any_worker_alive()

    def _on_watchdog(self, reason: str) -> None:
        # runs in the watchdog thread while the main thread is stuck somewhere in torch
        if self.agent is not None:
            self.agent.note_exits()  # before the kill: a rank that had finished shows so
            try:
                self.agent.collect_stacks(f"watchdog: {reason}")
            except Exception:  # the stacks must never keep the watchdog from its kill
                log.exception("watchdog: taking the ranks' stacks failed")
            self.agent.kill_all_workers()
        outcome = Outcome("watchdog", message=f"watchdog: {reason}")
        try:
            result = self._build(outcome)
        except Exception:
            log.exception("watchdog: building the full result failed; writing a minimal one")
            result = self._build(outcome, full=False)
        self.write(result, final=True)
        self._stop_zygote()
        self.orphans.kill_all()
        self.reaper.finish(timeout=2)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(AGENT_ERROR_EXIT_CODE)

    # -- the run -----------------------------------------------------------------------------
    def _entrypoint(self) -> tuple[Any, tuple[str, ...]]:
        entry, args = self.settings.entrypoint, tuple(self.settings.entry_args)
        if not isinstance(entry, str):
            return entry, args  # --run-path: a function in spawned processes
        # every binary worker starts through the exec wrapper: dies with the agent
        # (PR_SET_PDEATHSIG) and writes stdout and stderr into one ordered log
        merge = ("--merge-stderr",) if self.settings.merge_streams else ()
        wrapper = ("-I", "-S", EXEC_WRAPPER, "--agent-pid", str(os.getpid()), *merge, "--", entry)
        return sys.executable, (*wrapper, *args)

    def execute(self) -> Outcome:
        """Run the agent to its end; every exception becomes an :class:`Outcome`."""
        self.reaper.start()
        self._start_zygote()  # first: it imports torch while the agent does its own imports
        import torch.distributed.elastic.rendezvous.registry as rdzv_registry
        from torch.distributed.elastic import events, metrics
        from torch.distributed.elastic.multiprocessing import SignalException
        from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousParameters

        from torchstep.agent.elastic import TorchstepAgent
        from torchstep.agent.logs import TorchstepLogsSpecs
        from torchstep.agent.stores import private_handler, private_params

        settings, config = self.settings, self.settings.config
        self.write(running_result(settings, started_at=self.started_at), final=False)
        if become_subreaper():  # a worker's daemon comes back to us, not to init
            self.orphans.start()
        self.watchdog.start()
        read_timeout = float(config.rdzv_configs.get("read_timeout", 60))
        self.watchdog.phase("connecting to the rendezvous backend", max(read_timeout, settings.rendezvous_bound()))
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
        handler = None
        shutdown_rdzv = True
        try:
            signals.check()  # one the zygote's start or an import swallowed
            join_moved_store(config)
            params = private_params(  # a one-node rendezvous: its stores listen on loopback only
                RendezvousParameters(
                    backend=config.rdzv_backend,
                    endpoint=config.rdzv_endpoint,
                    run_id=config.run_id,
                    min_nodes=config.min_nodes,
                    max_nodes=config.max_nodes,
                    local_addr=config.local_addr,
                    **config.rdzv_configs,
                )
            )
            master_addr, master_port = compat.addr_and_port(params)
            handler = private_handler(params)
            if handler is None:
                handler = rdzv_registry.get_rendezvous_handler(params)
            guard_rendezvous(handler, config.rdzv_endpoint)
            compat.quicken_rendezvous(single_node=config.max_nodes == 1)
            if settings.sources.get("rdzv_conf.keep_alive_interval") == "default":
                fast_keep_alive(handler, PRIVATE_KEEP_ALIVE_S if private_rendezvous(config) else KEEP_ALIVE_PERIOD_S)
            entrypoint, args = self._entrypoint()
            spec = compat.worker_spec(
                role=settings.role,
                local_world_size=config.nproc_per_node,
                entrypoint=entrypoint,
                args=args,
                rdzv_handler=handler,
                max_restarts=config.max_restarts,
                monitor_interval=config.monitor_interval,
                master_addr=master_addr,
                master_port=master_port,
                local_addr=config.local_addr,
                event_log_handler=config.event_log_handler,
                numa_options=config.numa_options,
                duplicate_stdout_filters=config.duplicate_stdout_filters,
                duplicate_stderr_filters=config.duplicate_stderr_filters,
                virtual_local_rank=config.virtual_local_rank,
            )
            merge = settings.merge_streams and isinstance(settings.entrypoint, str)
            # pipelines keep torchstep's layout (rank<N>.log); run by hand, torchrun's
            specs = TorchstepLogsSpecs(
                settings.log_dir,
                merge_streams=merge,
                run_id=config.run_id,
                layout="torchstep" if settings.merge_streams else "torchrun",
                inner=settings.logs_specs_factory() if settings.logs_specs_factory else None,
                # torch's redirect of a function worker (--run-path) seeks in its file: no pipe there
                pipe_dir=self.run_dir if isinstance(settings.entrypoint, str) else None,
                on_warning=self._warn,
            )
            self.agent = TorchstepAgent(
                spec,
                specs,
                settings,
                run_dir=self.run_dir,
                reaper=self.reaper,
                exits=self.exits,
                watchdog=self.watchdog,
                warnings=self.warnings,
                zygote=self.zygote,
            )
            self.agent.rdzv_params = params  # a store move rebuilds the rendezvous from them
            metrics.initialize_metrics(metrics.MetricsConfig(config.metrics_cfg))
            result = self.agent.run()
            events.record(self.agent.get_event_succeeded(), config.event_log_handler)
            if result.is_failed() and not self.agent.graceful_exit:
                self._failures = dict(result.failures)  # reported by finish(), from the result's root cause
            if self.agent.graceful_exit:
                return Outcome(
                    "workers", succeeded=True, message=f"{GRACEFUL_EXIT_MESSAGE}: {self.agent.graceful_exit}"
                )
            return Outcome("workers", succeeded=not result.is_failed())
        except SignalException as e:
            # like torch: a signalled agent does not close the rendezvous (peers may go on)
            shutdown_rdzv = False
            self._record_failed_event(events, config)
            return Outcome("cancelled", signal=int(e.sigval))
        except signals.Cancelled as e:
            shutdown_rdzv = False
            return Outcome("cancelled", signal=e.signum)
        except RendezvousError as e:
            self._record_failed_event(events, config)
            log.error("rendezvous failed: %s: %s", type(e).__name__, e)
            return Outcome("rendezvous", message=f"rendezvous failed: {type(e).__name__}: {e}".rstrip(": "))
        except Exception as e:
            signum = signals.pending()
            if signum is not None:  # a signal surfaced as another exception
                shutdown_rdzv = False
                return Outcome("cancelled", signal=signum)
            self._record_failed_event(events, config)
            log.error("agent error:\n%s", traceback.format_exc())
            return Outcome("agent_error", message=f"agent error: {type(e).__name__}: {e}")
        finally:
            signals.enter_late_mode()
            if handler is not None and shutdown_rdzv:
                self.watchdog.phase("closing the rendezvous", float(config.rdzv_configs.get("close_timeout", 30)) + 10)
                try:
                    handler.shutdown()
                except Exception as e:
                    log.warning("closing the rendezvous failed: %s: %s", type(e).__name__, e)

    def _start_zygote(self) -> None:
        """Start (or configure) the worker zygote, unless the settings say workers are exec'd
        (the settings line on the console says why)."""
        prestarted, self._prestarted = self._prestarted, None
        why = self.settings.exec_reason()
        if why:
            log.info("workers start by exec, not from the worker zygote: %s", why)
            if prestarted is not None:
                prestarted.stop()
            return
        from torchstep.agent.zygote_handle import ZygoteProcess

        try:
            self.zygote = prestarted if prestarted is not None else ZygoteProcess.prestart()
            self.orphans.helper(self.zygote.proc.pid)
            self.reaper.watch_pid(self.zygote.proc.pid)  # a SIGKILLed agent takes it along too
            self.zygote.configure(self.run_dir, self.reaper.command_fd())
        except OSError as e:
            log.warning("could not start the worker zygote (%s); workers start by exec", e)
            self._stop_zygote()

    def _stop_zygote(self) -> None:
        zygote, self.zygote = self.zygote, None
        if zygote is not None:
            try:
                zygote.stop()
            except Exception as e:  # the reaper and the sweeper still kill what is left
                log.warning("stopping the worker zygote: %s", e)

    def _record_failed_event(self, events: Any, config: Any) -> None:
        if self.agent is not None:
            try:
                events.record(self.agent.get_event_failed(), config.event_log_handler)
            except Exception:
                pass

    def finish(self, outcome: Outcome) -> StepResult:
        """Write the final result and stop the watchdog and the reaper."""
        self.watchdog.stop()
        try:
            result = self._build(outcome)
        except Exception:  # a bug here must not cost the result: write what is certain
            log.exception("building the full result failed; writing a minimal one")
            result = self._build(outcome, full=False)
        self.write(result, final=True)
        if self._failures:
            root = result.root_cause.rank if result.root_cause is not None else None
            report_child_failure(self.settings, self._failures, root_rank=root)
        self._stop_zygote()
        self.orphans.kill_all()
        self.reaper.finish()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        return result


def join_moved_store(config: Any) -> None:
    """With ``--rdzv-conf store_takeover=on`` and ``store_candidates``: where the run's
    rendezvous store moved to a survivor before this agent started (it replaces the lost
    node), meet the run there: the endpoint is the moved store's, and this agent does not
    host one (:func:`torchstep.agent.store_move.find_moved`)."""
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from torchstep.agent import store_move

    conf = config.rdzv_configs
    hosts = store_move.candidates(conf)
    if config.rdzv_backend != "c10d" or not hosts:
        return
    if not store_move.enabled(conf, min_nodes=config.min_nodes, max_nodes=config.max_nodes):
        return
    try:
        _, port = parse_rendezvous_endpoint(str(config.rdzv_endpoint).strip(), default_port=29400)
    except ValueError:
        return  # torch's handler refuses the endpoint with its own message
    host = store_move.find_moved(config.run_id, hosts, port)
    if host is not None:
        moved = store_move.endpoint_of(host, port)
        log.warning("the rendezvous store moved from %s to %s: joining the run there", config.rdzv_endpoint, moved)
        config.rdzv_endpoint = moved
        conf["is_host"] = "false"


def guard_rendezvous(handler: Any, endpoint: str) -> None:
    """A forged rendezvous state fails the run instead of running code in the agent
    (:mod:`torchstep.agent.rdzv_guard`); a dynamic handler this torch cannot guard is
    said on the console."""
    from torchstep.agent.rdzv_guard import guard_handler

    if not guard_handler(handler, endpoint) and type(handler).__name__ == "DynamicRendezvousHandler":
        log.warning("cannot check the rendezvous state on this torch: a forged state in %s is not refused", endpoint)


#: The keep-alive tick of a rendezvous no other node can reach (:func:`private_rendezvous`):
#: nobody reads its heartbeats, so they are sent rarely (a 0.5 s tick cost the agent ~0.3 CPU
#: s/min); the dead-node expiry stays this tick x ``keep_alive_max_attempt``.
PRIVATE_KEEP_ALIVE_S = 10.0


def private_rendezvous(config: Any) -> bool:
    """Whether the rendezvous is this agent's alone: one node at most, on a store the agent
    hosts on a port it picks itself (``--standalone``, torchrun's single-node default:
    ``localhost:0``), which no other agent can know.

    Args:
        config: torch's ``LaunchConfig``.

    Returns:
        ``True`` for such a rendezvous.
    """
    endpoint = str(getattr(config, "rdzv_endpoint", "") or "")
    return getattr(config, "max_nodes", 0) == 1 and endpoint.endswith(":0")


def fast_keep_alive(handler: Any, period_s: float) -> bool:
    """Give a dynamic rendezvous handler a sub-second keep-alive tick (torch parses
    ``keep_alive_interval`` as whole seconds). Every holder of the handler's settings gets
    the same new object, so the heartbeat period and the dead-node expiry agree. False
    (and nothing changed) for handlers without these settings (static, etcd)."""
    return compat.set_keep_alive(handler, period_s)


def report_child_failure(settings: AgentSettings, failures: dict[int, Any], *, root_rank: int | None = None) -> None:
    """torchrun's root-cause report on stderr (``ChildFailedError``: first observed
    failure with time, host, rank, exit code, error file, traceback), so what a torchrun
    user greps for is there; the result file says the same in JSON.

    ``root_rank``: the global rank the result names as the root cause (exact exit times):
    the report's "Root Cause" is that rank too. torch picks the smallest timestamp in whole
    seconds, so ranks that fail within the same second would otherwise tie and the report
    would name the lowest rank, not the first failure.
    """
    try:
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

        class _Report(ChildFailedError):
            def get_first_failure(self) -> tuple[int, Any]:
                if root_rank is not None and root_rank in self.failures:
                    return root_rank, self.failures[root_rank]
                return super().get_first_failure()

        name = compat.entrypoint_name(settings.entrypoint, list(settings.entry_args))
        report = _Report(name=name, failures=failures).format_msg()
    except Exception as e:  # a report must never cost the result
        log.warning("could not format the failure report: %s: %s", type(e).__name__, e)
        return
    try:
        sys.stderr.write(f"torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n{report}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def cancelled_before_start(settings: AgentSettings | None, signum: int, *, started_at: float) -> StepResult:
    """The result when a signal arrives before the run began (e.g. during ``import torch``).

    Example: ``cancelled_before_start(None, 15, started_at=t0).exit_code`` is 143.
    """
    return build_result(
        settings, None, Outcome("cancelled", signal=signum), started_at=started_at, ended_at=time.time()
    )
