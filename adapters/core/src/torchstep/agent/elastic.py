"""``TorchstepAgent``: torch's ``LocalElasticAgent`` with torchstep's additions.

Process supervision (rendezvous, start, monitor, restart within ``--max-restarts``, exit
barrier) stays torch's; the subclass hooks in around it:

* every worker group start is a :class:`GroupStart` with its own log directory
  (``attempt_<k>``, torchrun's name), exact exit times (``waitid``) and which ranks died
  first and which the agent stopped afterwards;
* the file timer server is always on and kills only the stuck worker's process group;
  ``--heartbeat-timeout`` does the same for workers that stop calling ``heartbeat()``;
* a non-retryable failure (exit 82 or ``NonRetryableError`` in the error file) stops
  restarts at once;
* stopping a group SIGKILLs the whole process groups afterwards (dataloader children,
  grandchildren), and the wait after a failure is ``--stop-timeout``, not torch's fixed 30 s;
* a second signal while the first one's grace period runs kills everything at once;
* every stop that is not the workers' own exit (signal, timer, heartbeat, ``--hang-timeout``,
  watchdog) first takes every live rank's stacks (:meth:`TorchstepAgent.collect_stacks`).

Example (what :mod:`torchstep.agent.runner` does)::

    agent = TorchstepAgent(spec, logs_specs, settings, run_dir=d, reaper=r, exits=ExitWatcher(), watchdog=wd)
    result = agent.run()          # torch's RunResult; agent.attempts has the details
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
from torch.distributed.elastic.agent.server.api import DEFAULT_ROLE, RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure
from torch.distributed.elastic.rendezvous import RendezvousError, RendezvousGracefulExitError

from torchstep.agent import compat, signals
from torchstep.agent.hang import HangWatch, ProgressWatch, gpu_present, nccl_env, request_nccl_dumps
from torchstep.agent.logs import RankPaths, TorchstepLogsSpecs, line_prefix
from torchstep.agent.procs import ExitInfo, ExitWatcher, Reaper, exited_now, kill_groups, pid_alive, signal_group
from torchstep.agent.readiness import ReadyFile
from torchstep.agent.settings import AgentSettings
from torchstep.agent.stacks import RankStack, StackTarget, collect, outliers, summary, write_file
from torchstep.agent.tee import LogTee, TeeSource
from torchstep.agent.timers import HeartbeatWatch, ReapingTimerServer
from torchstep.agent.watchdog import ProgressWatchdog
from torchstep.agent.zygote_handle import ZygoteProcess, worker_ended, wrapper_of
from torchstep.contract import (
    ENV_COLLECTIVES_FILE,
    ENV_PROGRESS_FILE,
    ENV_STACKS_FILE,
    NON_RETRYABLE_EXIT_CODE,
    is_non_retryable,
)
from torchstep.contract import ENV_HEARTBEAT_FILE as HEARTBEAT_FILE_ENV
from torchstep.contract import ENV_OUTPUT_FILE as OUTPUT_FILE_ENV
from torchstep.contract import ENV_TIMER_FILE as TIMER_FILE_ENV
from torchstep.result import StepState
from torchstep.untrusted import MAX_ERROR_FILE_BYTES, read_json_file

log = logging.getLogger("torchstep.agent")

# an attempt's states: the result's one Enum (STOPPED: the agent stopped the group itself)
RUNNING, SUCCEEDED, FAILED, CANCELLED, STOPPED = (
    StepState.RUNNING,
    StepState.SUCCEEDED,
    StepState.FAILED,
    StepState.CANCELLED,
    StepState.STOPPED,
)


@dataclass
class WorkerRecord:
    """One worker process of one attempt.

    Example: ``agent.attempts[-1].workers[0].exit.exit_code`` is local rank 0's exit code.
    """

    local_rank: int
    global_rank: int
    paths: RankPaths
    heartbeat_file: str
    pid: int | None = None
    own_group: bool = False  # leader of its own process group (binary entrypoints)
    exit: ExitInfo | None = None
    dead_before_stop: bool = False  # already dead when the agent began stopping the group
    reason: str | None = None  # timer_expired | heartbeat_timeout (set when the agent kills it)
    detail: str | None = None
    #: The last lines of its stdout and stderr as the tee saw them (whatever the log files kept).
    tails: dict[str, Any] = field(default_factory=dict)
    stacks_file: str = ""  # where its faulthandler writes (TORCHSTEP_STACKS_FILE)
    progress_file: str = ""  # what torchstep.progress() writes (TORCHSTEP_PROGRESS_FILE)
    collectives_file: str = ""  # touched when a collective returns (TORCHSTEP_COLLECTIVES_FILE)
    #: Where it was when the agent stopped the group (collect_stacks), if it did.
    stack: RankStack | None = None


@dataclass
class GroupStart:
    """One start of the worker group (initial start, restart or membership change).

    Example: ``[a.state for a in agent.attempts]`` is ``["FAILED", "SUCCEEDED"]`` after one restart.
    """

    index: int
    restart_count: int
    group_rank: int
    group_world_size: int
    world_size: int
    started_at: float
    log_dir: str
    workers: dict[int, WorkerRecord] = field(default_factory=dict)
    state: StepState = RUNNING
    failures: dict[int, Any] = field(default_factory=dict)  # global rank -> torch ProcessFailure
    non_retryable: bool = False
    stop_started_at: float | None = None
    ended_at: float | None = None
    cleaned: bool = False
    #: collect_stacks ran for this attempt: its one-line summary and the file with every dump.
    stacks_summary: str | None = None
    stacks_file: str | None = None
    hang_fired: bool = False
    #: when the agent first killed a rank it named (hang, heartbeat, timer): a peer that dies
    #: after it, its collective broken, is collateral like one the stop kills, not a culprit.
    culprit_killed_at: float | None = None


class TorchstepAgent(compat.agent_base()):  # type: ignore[misc]  # torch's LocalElasticAgent
    """See the module docstring. ``attempts`` and the counters are read by the result.

    Example::

        agent = TorchstepAgent(spec, specs, settings, run_dir=d, reaper=r, exits=ExitWatcher(), watchdog=wd)
        agent.run(); agent.failure_restarts   # 1
    """

    remaining_restarts: int  # torch's budget left (a property of compat's base)

    def __init__(
        self,
        spec: Any,
        logs_specs: TorchstepLogsSpecs,
        settings: AgentSettings,
        *,
        run_dir: str,
        reaper: Reaper,
        exits: ExitWatcher,
        watchdog: ProgressWatchdog,
        warnings: list[str] | None = None,
        zygote: ZygoteProcess | None = None,
    ) -> None:
        super().__init__(
            spec,
            logs_specs,
            start_method=settings.config.start_method,
            exit_barrier_timeout=settings.exit_barrier_timeout,
            shutdown_timeout=settings.config.shutdown_timeout,
        )
        self.settings = settings
        self.attempts: list[GroupStart] = []
        self.failure_restarts = 0
        self.membership_restarts = 0
        self.cancel_signal: int | None = None
        self.graceful_exit: str | None = None
        self._specs = logs_specs
        self._run_dir = run_dir
        self._reaper = reaper
        self._exits = exits
        self._watchdog = watchdog
        self._zygote = zygote
        self._tee: LogTee | None = None
        self._timer_server: ReapingTimerServer | None = None
        self._worker_store: Any = None
        self._agent_hosts_store = False
        self._heartbeats = HeartbeatWatch(settings.heartbeat_timeout) if settings.heartbeat_timeout > 0 else None
        hang_timeout = getattr(settings, "hang_timeout", 0.0)
        self._hang = HangWatch(hang_timeout) if hang_timeout > 0 else None
        self._progress = ProgressWatch()
        self._nccl = gpu_present(os.environ)  # workers may use NCCL: its flight recorder on
        self._stacks_lock = threading.Lock()
        self._liveness: Any = None  # torchstep.agent.liveness.LivenessMonitor, from the first rendezvous
        self._liveness_started = False
        self._silence: tuple[Any, int | None] | None = None  # (Silence, attempt index it stopped)
        self._rdzv_round: int | None = None
        # the round's participants as it formed (the monitor removes silent nodes from the
        # shared state afterwards): a majority is counted against them
        self._round_nodes: dict[Any, int] = {}
        # with store_takeover: why this side, a majority, moves a store whose host went silent
        self._store_outvoted: str | None = None
        self._move_verdict = "a majority"  # or the witness's choice of this half of an even split
        # with store_witness: what breaks an even split (torchstep.agent.witness), and its verdicts
        self._witness: Any = None
        self._claims: dict[str, bool] = {}
        #: torch's ``RendezvousParameters`` of the run (the runner sets them): a store move rebuilds from them.
        self.rdzv_params: Any = None
        self._moved_checked_at = 0.0
        #: What went wrong beside the outcome (a rank log a full disk truncated): the result's warnings.
        self.warnings: list[str] = warnings if warnings is not None else []
        self._warn_lock = threading.Lock()
        # TORCHSTEP_READY_FILE: present while this node's workers run in a formed gang (the
        # pod's readinessProbe); a file left from before this agent says nothing of it
        self._ready = ReadyFile.from_env()
        self._ready.clear()

    def warn(self, text: str) -> None:
        """Note ``text`` in the result's warnings (once) and on the console."""
        with self._warn_lock:
            if text in self.warnings:
                return
            self.warnings.append(text)
        log.warning("%s", text)

    # -- views used by the runner, the watchdog and the result --------------------------
    @property
    def group_rank(self) -> int | None:
        return self.attempts[-1].group_rank if self.attempts else None

    def any_worker_alive(self) -> bool:
        attempt = self.attempts[-1] if self.attempts else None
        return attempt is not None and any(w.pid and pid_alive(w.pid) for w in attempt.workers.values())

    def note_exits(self) -> None:
        """Record the exits the exit watcher saw but the (wedged) main loop did not: a result
        written by the watchdog then shows ranks that finished as finished, not RUNNING."""
        for attempt in self.attempts[-1:]:
            for w in attempt.workers.values():
                if w.pid and w.exit is None:
                    w.exit = self._exits.get(w.pid)

    def kill_all_workers(self) -> None:
        """SIGKILL every worker's process group now (watchdog, second signal)."""
        for attempt in self.attempts[-1:]:
            for w in attempt.workers.values():
                if w.pid:
                    self._kill(w, signal.SIGKILL)

    # -- rendezvous / start ----------------------------------------------------------------
    def rendezvous_group(self, worker_group: WorkerGroup) -> None:
        self._watchdog.phase("rendezvous", self.settings.rendezvous_bound())
        self._start_liveness(worker_group)
        self._restart_when_store_lost(worker_group.spec.rdzv_handler)
        if self._move_store_if_gone(worker_group):
            self._watchdog.phase("rendezvous", self.settings.rendezvous_bound())
        try:
            self.torch_rendezvous(worker_group)
        except RendezvousError:  # the store's agent died during this rendezvous
            if not self._move_store_if_gone(worker_group, failed=True):
                raise
            self._watchdog.phase("rendezvous", self.settings.rendezvous_bound())
            self.torch_rendezvous(worker_group)
        self._rdzv_round = compat.rdzv_round(worker_group.spec.rdzv_handler)
        self._round_nodes = compat.rdzv_participants(worker_group.spec.rdzv_handler)
        self._watchdog.phase("starting workers", 120)
        self._agent_hosts_store = self._host_worker_store(worker_group)
        signals.check()  # before any worker starts

    def _host_worker_store(self, wg: WorkerGroup) -> bool:
        """A fresh store for this group start, hosted by the node-rank-0 agent.

        pytorch#135712: a store shared across restarts hands a restarted gloo group the
        previous attempt's keys (extra restarts, hangs), so torch's fix
        (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) lets worker rank 0 host a new store each
        time — and every other rank then retries its connection until rank 0 has imported
        torch (~0.3 s per start). Here the agent binds the new store at once on the address
        the rendezvous published, so workers only connect as clients. If binding fails, the
        workers fall back to torch's way.
        """
        self._worker_store = None  # the previous attempt's store: closed
        if wg.spec.rdzv_handler.use_agent_store or self.settings.config.rdzv_backend not in ("c10d", "etcd-v2"):
            return False
        from torchstep.agent.stores import host_store

        key = "torchstep/agent_hosts_worker_store"
        store: Any = wg.store  # the rendezvous round's store (torch types it Optional)
        addr: Any = wg.master_addr
        port: Any = wg.master_port
        if wg.group_rank == 0:
            ok = False
            try:
                self._worker_store = host_store(addr, port)  # loopback only where addr is loopback
                ok = True
            except Exception as e:  # the free port was taken meanwhile
                log.warning("cannot host the workers' store on port %s: %s", port, e)
            store.set(key, "1" if ok else "0")
            return ok
        try:
            store.wait([key], timedelta(seconds=60))
            return bool(store.get(key) == b"1")
        except Exception as e:
            log.warning("node rank 0 did not say who hosts the workers' store (%s): workers host it", e)
            return False

    def prepare_workers(self, envs: dict[int, dict[str, str]]) -> None:
        # torch calls this with each worker's environment just before the processes start:
        # the place to add ours and to open the attempt (torch's own file timer server is
        # not started: ours below, once per agent)
        if self._zygote is not None:
            self._zygote.running()  # a dead zygote: these workers are exec'd (one warning)
        wg = self.current_group
        attempt_dir = self._specs.begin_attempt()
        index = len(self.attempts)
        control = os.path.join(self._run_dir, f"attempt_{index}")
        os.makedirs(control, exist_ok=True)
        first = envs.get(0, {})
        attempt = GroupStart(
            index=index,
            restart_count=int(first.get("TORCHELASTIC_RESTART_COUNT", 0)),
            group_rank=wg.group_rank if wg.group_rank is not None else 0,
            group_world_size=wg.group_world_size or 1,
            world_size=int(first.get("WORLD_SIZE", len(envs))),
            started_at=time.time(),
            log_dir=attempt_dir,
        )
        fifo = os.path.join(self._run_dir, "timer.fifo")
        if self._timer_server is None:
            # one server for the agent's life (torch starts one per group start and stops it
            # in _shutdown: that costs every restart up to its poll interval)
            self._timer_server = ReapingTimerServer(
                fifo, first.get("TORCHELASTIC_RUN_ID", ""), on_expired=self._on_timer_expired
            )
            self._timer_server.start()
        for local_rank, env in envs.items():
            rank = int(env.get("RANK", local_rank))
            record = WorkerRecord(
                local_rank=local_rank,
                global_rank=rank,
                paths=self._specs.paths(attempt_dir, rank, local_rank),
                heartbeat_file=os.path.join(control, f"heartbeat.{local_rank}"),
            )
            attempt.workers[local_rank] = record
            env[TIMER_FILE_ENV] = fifo
            if self._agent_hosts_store:
                env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # connect as clients only
            env[HEARTBEAT_FILE_ENV] = record.heartbeat_file
            env[OUTPUT_FILE_ENV] = record.paths.outputs
            record.stacks_file = env[ENV_STACKS_FILE] = os.path.join(control, f"stacks.{local_rank}")
            record.progress_file = env[ENV_PROGRESS_FILE] = os.path.join(control, f"progress.{local_rank}")
            if self._hang is not None:  # only then: a touch a second per rank for nothing otherwise
                record.collectives_file = env[ENV_COLLECTIVES_FILE] = os.path.join(control, f"collectives.{local_rank}")
            if self._nccl:
                env.update(nccl_env(env, attempt_dir, torch.__version__))
        if self._heartbeats is not None:
            self._heartbeats.reset({lr: w.heartbeat_file for lr, w in attempt.workers.items()})
        self._progress.reset({w.global_rank: w.progress_file for w in attempt.workers.values()})
        self.attempts.append(attempt)
        log.info(
            "attempt %d: ranks %s, logs in %s", index, [w.global_rank for w in attempt.workers.values()], attempt_dir
        )

    def start_group(self, worker_group: WorkerGroup) -> dict[int, Any]:
        with self._exits.starting():  # until each new worker is watched, none is taken for an adopted orphan
            pids = self.torch_start_workers(worker_group)
            for pid in pids.values():
                self._exits.watch(pid)
        signals.install_torch(self.settings.config.signals_to_handle)  # PContext.start set torch's own
        attempt = self.attempts[-1]
        pcontext = self.process_context
        if pcontext is not None:
            original_close = pcontext.close

            def close(death_sig: Any = None, timeout: float = 30) -> None:
                self._before_stop(attempt)
                original_close(death_sig, timeout)  # type: ignore[arg-type]

            # torch's process context closes itself when it sees a failure: note who was
            # already dead at that moment (the failures) before it kills the others
            pcontext.close = close  # type: ignore[method-assign]
        sources = []
        for local_rank, pid in pids.items():
            w = attempt.workers[local_rank]
            w.pid = pid
            try:
                w.own_group = os.getpgid(pid) == pid
            except ProcessLookupError:
                w.own_group = False
            if w.own_group:
                self._reaper.watch_group(pid)
            else:
                self._reaper.watch_pid(pid)
            prefix = line_prefix(
                self.settings.prefix_template, role=worker_group.spec.role, rank=w.global_rank, local_rank=local_rank
            )
            out_prefixed, err_prefixed = self.settings.prefixed(local_rank)
            echo = self.settings.echo_ranks(local_rank)
            # merged streams are prefixed as stdout; split ones go to the console's own stream
            if self._specs.inner is not None:  # a --logs-specs of the user's decided where the streams go
                w.paths = self._specs.dests.get(local_rank, w.paths)
                continue  # ... and tees them itself (torch's TailLog), as under torchrun
            pipes = self._specs.pipes.pop(local_rank, {})
            out = TeeSource(w.paths.log, prefix if out_prefixed else "", echo, pipe=pipes.get("out"))
            sources.append(out)
            w.tails["out"] = out.tail
            if w.paths.stderr:
                err = TeeSource(
                    w.paths.stderr, prefix if err_prefixed else "", echo, to_stderr=True, pipe=pipes.get("err")
                )
                sources.append(err)
                w.tails["err"] = err.tail
        self._specs.close_pipes()  # none left unless a worker did not start
        filters = list(worker_group.spec.duplicate_stdout_filters or []) + list(
            worker_group.spec.duplicate_stderr_filters or []
        )
        if self._hang is not None:  # here: a --logs-specs of the user's has just decided the log paths
            watched = [w.heartbeat_file for w in attempt.workers.values()]
            watched += [w.progress_file for w in attempt.workers.values()]
            watched += [w.collectives_file for w in attempt.workers.values()]
            watched += [p for w in attempt.workers.values() for p in (w.paths.log, w.paths.stderr) if p]
            self._hang.reset(watched)
        self._tee = LogTee(
            sources, filters=filters, filter_file=os.path.join(attempt.log_dir, "filtered.log"), on_warning=self.warn
        ).start()
        self._watchdog.phase("monitoring")
        self._ready.mark()  # the rendezvous formed the world and this node's workers started
        return pids

    # -- monitor -------------------------------------------------------------------------
    def monitor_group(self, worker_group: WorkerGroup) -> RunResult:
        signals.check()  # a signal whose exception some library swallowed: act on it now
        self._watchdog.tick()
        attempt = self.attempts[-1]
        if self._zygote is not None:
            self._check_zygote(attempt)
        self._check_heartbeats(attempt)
        silenced = self._act_on_silence(worker_group, attempt)
        if silenced is not None:
            return silenced
        joined = self._join_moved_store(worker_group)
        if joined is not None:
            return joined
        self._check_hang(attempt)
        self._progress.tick()
        result: RunResult = self.torch_monitor_workers(worker_group)
        if result.state in (WorkerState.FAILED, WorkerState.UNHEALTHY):
            attempt.state = FAILED
            attempt.failures = dict(result.failures)
            attempt.ended_at = attempt.ended_at or time.time()
            attempt.failures.update(self._raised_non_retryable(worker_group, attempt.failures))
            bad = [rank for rank, f in attempt.failures.items() if is_non_retryable(f.exitcode, f.error_file_data)]
            if bad:
                attempt.non_retryable = True
                if self.remaining_restarts > 0:
                    log.error(
                        "rank(s) %s failed non-retryably: no restart (%d left unused)", bad, self.remaining_restarts
                    )
                self.remaining_restarts = 0
        elif result.state == WorkerState.SUCCEEDED:
            attempt.state = SUCCEEDED
            attempt.ended_at = time.time()
        return result

    def _raised_non_retryable(self, wg: WorkerGroup, failures: dict[int, Any]) -> dict[int, ProcessFailure]:
        """The ranks still exiting whose error file already says ``NonRetryableError``: the
        rank raised it, and its peers (their collective broken by its exit) were seen to fail
        first; the stop that follows would kill it before its exit code says 82, and the
        group would look retryable. Each joins the attempt's failures as the exit it was
        making (82, its error file's time: the root cause when it was the first)."""
        files: dict[int, str] = getattr(self.process_context, "error_files", None) or {}
        found: dict[int, ProcessFailure] = {}
        for w in wg.workers:
            path = files.get(w.local_rank)
            if w.global_rank in failures or not path or not os.path.isfile(path):
                continue
            data, _ = read_json_file(path, MAX_ERROR_FILE_BYTES, what=f"rank {w.global_rank}'s error file")
            if isinstance(data, dict) and is_non_retryable(None, data):
                found[w.global_rank] = ProcessFailure(w.local_rank, w.id or -1, NON_RETRYABLE_EXIT_CODE, path)
        if found:
            log.info("rank(s) %s raised NonRetryableError and are still exiting", sorted(found))
        return found

    # -- silent peers (torchstep.agent.liveness) ------------------------------------------
    def _start_liveness(self, wg: WorkerGroup) -> None:
        """Start the liveness monitor once, on the first rendezvous (c10d with several nodes;
        ``--rdzv-conf liveness=off`` turns it off)."""
        if self._liveness_started:
            return
        self._liveness_started = True
        config = self.settings.config
        if str(config.rdzv_configs.get("liveness", "on")).strip().lower() in ("0", "off", "false", "no"):
            return
        from torchstep.agent.liveness import LivenessMonitor

        self._liveness = LivenessMonitor.create(
            wg.spec.rdzv_handler,
            str(config.rdzv_endpoint),
            fixed_size=config.min_nodes == config.max_nodes,
            on_silent=self._on_silent,
            on_cut_off=self._on_cut_off,
        )
        if self._liveness is not None:
            self._liveness.start()
            if self._hang is not None:  # no rank of any node progressed: the group's hang
                self._hang.peers = self._liveness
            self._start_witness(wg)

    def _start_witness(self, wg: WorkerGroup) -> None:
        """With ``store_takeover`` and ``--rdzv-conf store_witness=kubernetes``: the Lease that
        breaks an even split, checked now so that a missing permission is said at start (in
        the result's warnings) instead of found at a split."""
        from torchstep.agent.witness import WITNESS_CONF, LeaseWitness

        # any value but kubernetes or off was refused at start (settings._check_store_takeover)
        kind = str(self.settings.config.rdzv_configs.get(WITNESS_CONF, "off")).strip().lower()
        if kind != "kubernetes" or not self._takeover_enabled():
            return
        witness = LeaseWitness.in_cluster(str(wg.spec.rdzv_handler.get_run_id()))
        if witness is None:
            return

        def check() -> None:  # beside the workers' start: an API server slow to answer delays nothing
            problem = witness.check()
            if problem is not None:
                self.warn(f"{WITNESS_CONF}: {problem}")
            else:
                self._witness = witness

        threading.Thread(target=check, name="torchstep-store-witness", daemon=True).start()

    def _even_split_won(self) -> bool:
        """This half of an even split holds the witness's Lease for it (``False`` without a
        witness: an even split then keeps the store where it is). Both halves name the split
        alike: the store they lost each other on and the round they were in."""
        monitor, me = self._liveness, self._me()
        if self._witness is None or monitor is None or me is None:
            return False
        epoch = f"{monitor.store_host}:{monitor.store_port}#{self._rdzv_round}"
        if epoch not in self._claims:
            self._claims[epoch] = self._witness.claim(epoch, str(me))
            log.warning(
                "an even split of the last round's %d nodes: the store witness (lease %s) %s",
                len(self._round_nodes),
                self._witness.name,
                "chose this half" if self._claims[epoch] else "chose the other half (or did not answer)",
            )
        return self._claims[epoch]

    def _takeover_enabled(self) -> bool:
        from torchstep.agent import store_move

        config = self.settings.config
        asked = self._liveness is not None and store_move.enabled(
            config.rdzv_configs, min_nodes=config.min_nodes, max_nodes=config.max_nodes
        )
        if asked and not store_move.torch_supports():
            self.warn(store_move.UNSUPPORTED)
            return False
        return asked

    def _restart_when_store_lost(self, handler: Any) -> None:
        """With ``store_takeover``: torch's loop asks the store how many nodes wait while the
        group is healthy, and a store that is gone would end the run there, before the
        workers' failure is seen. That call then says "a node waits" instead, so the group
        restarts (a membership change) and its rendezvous moves the store."""
        if not self._takeover_enabled() or "num_nodes_waiting" in vars(handler):
            return
        asked = type(handler).num_nodes_waiting

        def num_nodes_waiting() -> int:
            try:
                return int(asked(handler))
            except RendezvousError:
                if not self._store_process_ended(failed=True):
                    raise
                log.warning("the rendezvous store is lost: restarting the group to move the store")
                return 1

        handler.num_nodes_waiting = num_nodes_waiting

    def _join_moved_store(self, wg: WorkerGroup) -> RunResult | None:
        """With ``store_takeover``: an agent on the original store whose group is not full
        looks (every 2 s) for a store of this run that moved to a survivor, and joins the run
        there. This ends the race of a replacement of the lost node that started before the
        survivors moved the store (it found no moved store and hosts one of its own at the
        original endpoint): the moved store always wins, so the run is one again."""
        from torchstep.agent import store_move

        monitor, params = self._liveness, self.rdzv_params
        if monitor is None or params is None or not self._takeover_enabled():
            return None
        now = time.monotonic()
        if now - self._moved_checked_at < 2.0:
            return None
        self._moved_checked_at = now
        hosts = store_move.candidates(self.settings.config.rdzv_configs)
        if monitor.store_host in hosts or (wg.group_world_size or 0) >= self.settings.config.max_nodes:
            return None  # already on a moved store, or nobody is missing
        found = store_move.find_moved(str(params.run_id), hosts, monitor.store_port, timeout_s=2.0)
        if found is None:
            return None
        return self._join_store_at(wg, found, " while this node hosted one: joining the run there")

    def _join_store_at(self, wg: WorkerGroup, host: str, what: str) -> RunResult:
        """Rebuild the rendezvous on the moved store found on ``host`` (a client of it) and
        restart the group: a membership change, the others restart into a world with this node."""
        from torchstep.agent import store_move

        monitor, params = self._liveness, self.rdzv_params
        handler = wg.spec.rdzv_handler
        endpoint = store_move.move(
            handler, params, host_addr=host, port=monitor.store_port, host_it=False, timeout_s=30.0
        )
        monitor.retarget(handler, endpoint)
        self._restart_when_store_lost(handler)
        log.warning("this run's rendezvous store moved to %s%s", endpoint, what)
        self._rdzv_round = None
        self._silence = None
        self.restart_group(wg)
        return RunResult(state=WorkerState.HEALTHY)

    def _store_process_ended(self, *, failed: bool) -> bool:
        """Whether the store's process ended, so the store may move: its host refuses the
        connection, or it does not answer now but the store's connections were closed (an
        error, not a stall: a deleted pod's address stops answering too) — by the liveness
        monitor's reads, or by this agent's own call that just ``failed`` without a stall
        being seen. A store that stopped answering *first* is a partition: it stays."""
        from torchstep.agent.liveness import ALIVE, GONE

        monitor = self._liveness
        if monitor is None:
            return False
        if self._store_outvoted is not None:
            return True  # silent, and this side holds a majority of the round (_move_silent_store)
        verdict = monitor.store_verdict()
        if verdict == ALIVE:
            return False
        return verdict == GONE or monitor.store_ended() or (failed and monitor.cut_off is None)

    def _move_store_if_gone(self, wg: WorkerGroup, *, failed: bool = False) -> bool:
        """With ``--rdzv-conf store_takeover=on`` (elastic): when the store's process is gone
        (its host refuses the connection), rebuild the rendezvous on a new store hosted by the
        lowest-ranked survivor of the last round (:mod:`torchstep.agent.store_move`). When a
        rendezvous ``failed`` on the store while its endpoint answers (a new store there: the
        lost node's replacement hosts it), rebuild on that one instead.

        Returns:
            Whether the rendezvous was rebuilt.
        """
        from torchstep.agent import store_move
        from torchstep.agent.liveness import ALIVE

        config = self.settings.config
        monitor, params = self._liveness, self.rdzv_params
        if monitor is None or params is None or self._rdzv_round is None:
            return False  # no group formed yet (nothing to survive from), or no monitor to probe with
        if not self._takeover_enabled():
            return False
        old = f"{monitor.store_host}:{monitor.store_port}"
        handler = wg.spec.rdzv_handler
        if failed and monitor.store_verdict() == ALIVE:
            endpoint = store_move.move(
                handler, params, host_addr=monitor.store_host, port=monitor.store_port, host_it=False, timeout_s=30.0
            )
            monitor.retarget(handler, endpoint)
            self._rdzv_round = None
            self._restart_when_store_lost(handler)
            log.warning("the connection to the rendezvous store at %s broke while it answers: joining it again", old)
            return True
        if not self._store_process_ended(failed=failed):
            return False
        found = compat.rdzv_node_and_settings(handler)
        me = found[0] if found is not None else None
        # the round as it formed: the state the handler last read may be a later one that
        # this node was not (yet) part of (a late agent's round, a node the monitor removed),
        # and a list without this node has no survivor to choose (CI: "no survivor answers")
        participants = dict(self._round_nodes)
        if me not in participants:
            participants = compat.rdzv_participants(handler)
        log.info(
            "the rendezvous store at %s is gone; the last round: %s (this node: %s)",
            old,
            ", ".join(f"rank {r} {n}" for n, r in sorted(participants.items(), key=lambda i: i[1])),
            me,
        )
        successor = store_move.choose_successor(participants, me, monitor.probe_node, store_host=monitor.store_names())
        if successor is None:
            raise store_move.StoreMoveError(f"the rendezvous store at {old} is gone and no survivor answers")
        host_it = successor == me
        self._watchdog.phase("moving the rendezvous store", float(config.rdzv_configs.get("read_timeout", 60)) + 10)
        endpoint = store_move.move(
            handler,
            params,
            host_addr=str(successor.addr),
            port=monitor.store_port,
            host_it=host_it,
            timeout_s=min(60.0, float(config.rdzv_configs.get("read_timeout", 60))),
        )
        monitor.retarget(handler, endpoint)
        self._rdzv_round = None
        self._restart_when_store_lost(handler)
        log.warning(
            "the rendezvous store at %s is gone (%s): moved to %s, hosted by %s",
            old,
            f"its host went silent; this side: {self._move_verdict}" if self._store_outvoted else "its process ended",
            endpoint,
            "this node" if host_it else f"node {successor}",
        )
        self._store_outvoted = None
        return True

    def _on_silent(self, silence: Any) -> None:
        # the monitor's thread: the main loop acts on it at its next tick
        self._silence = (silence, None)

    def _on_cut_off(self, silence: Any) -> None:
        # the monitor's thread, while the main loop may be blocked on the store: stop the
        # workers now (they cannot finish a collective with the others anyway)
        attempt = self.attempts[-1] if self.attempts else None
        running = attempt is not None and attempt.state == RUNNING and attempt.stop_started_at is None
        self._silence = (silence, attempt.index if attempt is not None and running else None)
        if attempt is None or not running:
            return
        if self._fixed_size():
            self.collect_stacks(silence.message)
        for w in attempt.workers.values():
            if w.reason is None:
                w.reason, w.detail = "replica_lost", silence.message
            self._kill(w, signal.SIGKILL)
        self._move_silent_store(silence)

    def _move_silent_store(self, silence: Any) -> None:
        """With ``store_takeover``: the store's host went silent (or this node is cut off: a
        probe cannot tell). When the nodes of the last round that answer, without the store's
        host, are a majority, this side moves the store: the monitor shuts the store
        connections down, so the main loop's blocked call fails at once and its rendezvous
        moves the store (:meth:`_move_store_if_gone`). The store's side is then a minority
        and stops its workers (:meth:`_stop_outvoted`)."""
        from torchstep.agent import store_move

        monitor, me = self._liveness, self._me()
        if monitor is None or not self._takeover_enabled() or me is None or not self._round_nodes:
            return
        which, count = store_move.side(self._round_nodes, me, monitor.probe_node, store_host=monitor.store_names())
        total = len(self._round_nodes)
        if which == store_move.MAJORITY:
            verdict = "a majority"
        elif which == store_move.EVEN and self._even_split_won():
            verdict = "an even split, and the store witness chose this half"
        else:
            log.warning(
                "%d of the last round's %d nodes answer here without the store's host: not a majority, "
                "the store stays (this node waits to rejoin it)",
                count,
                total,
            )
            return
        self._move_verdict = verdict
        self._store_outvoted = (
            f"{silence.message}; {count} of the last round's {total} nodes answer without it: {verdict}"
        )
        log.warning("%s: moving the store", self._store_outvoted)
        monitor.release_store()

    def _me(self) -> Any:
        found = compat.rdzv_node_and_settings(self.current_group.spec.rdzv_handler)
        return found[0] if found is not None else None

    def _stop_outvoted(self, wg: WorkerGroup, attempt: GroupStart, silence: Any) -> RunResult | None:
        """With ``store_takeover``: peers went silent and this node reaches fewer than half of
        the last round's nodes (or half, and the store witness chose the other half). It is
        the side cut off (the others move the store), so it must not train on at the smaller
        size: it stops its workers and looks
        for the moved store on the candidates, where it rejoins the run once its link heals
        (every 2 s, up to the monitor's ``rejoin_s``; then the step fails, retryable).

        Returns:
            ``None`` when this node is not outvoted (it restarts at the new size as usual).
        """
        from torchstep.agent import store_move

        monitor, me, params = self._liveness, self._me(), self.rdzv_params
        if monitor is None or params is None or me is None or not self._takeover_enabled():
            return None
        if silence.round != self._rdzv_round:
            return None
        which, _ = store_move.side(self._round_nodes, me, monitor.probe_node)
        total = len(self._round_nodes)
        if which == store_move.MINORITY:
            why = f"{silence.message}; this node reaches fewer than half of the last round's {total} nodes: it is the one cut off"
        elif which == store_move.EVEN and self._witness is not None:
            # an even split: the workers stop now, whoever wins (they cannot finish a collective
            # with the silent half, and the winner restarts its group at the new size anyway)
            for w in attempt.workers.values():
                if w.reason is None:
                    w.reason, w.detail = "replica_lost", f"{silence.message}; the split is decided by the store witness"
                self._kill(w, signal.SIGKILL)
            if self._even_split_won():
                return None
            why = (
                f"{silence.message}; this node reaches half of the last round's {total} nodes and the store "
                "witness chose the other half"
            )
        else:
            return None
        log.error("%s: stopping its workers; the store moves to the others, this node rejoins it there", why)
        self._ready.clear()  # not in a formed world while it waits (the pod's readinessProbe)
        for w in attempt.workers.values():
            if w.reason is None:
                w.reason, w.detail = "replica_lost", why
            self._kill(w, signal.SIGKILL)
        hosts = store_move.candidates(self.settings.config.rdzv_configs)
        deadline = time.monotonic() + monitor.rejoin_s
        self._watchdog.phase("waiting for the moved rendezvous store", monitor.rejoin_s + 60)
        while time.monotonic() < deadline:
            signals.check()
            found = store_move.find_moved(str(params.run_id), hosts, monitor.store_port, timeout_s=2.0)
            if found is not None:
                return self._join_store_at(wg, found, ": rejoining the run there")
            time.sleep(1.0)
            self._watchdog.tick()
        log.error(
            "no moved rendezvous store found on %s within %gs", ", ".join(hosts) or "no candidate", monitor.rejoin_s
        )
        return self._failed_by_silence(attempt)

    def _fixed_size(self) -> bool:
        return bool(self.settings.config.min_nodes == self.settings.config.max_nodes)

    def _act_on_silence(self, wg: WorkerGroup, attempt: GroupStart) -> RunResult | None:
        """A silent peer of this round, or this node cut off while this attempt ran: restart
        at the new size (elastic: a membership change) or fail the group (fixed size)."""
        taken, self._silence = self._silence, None
        if taken is None:
            return None
        silence, stopped = taken
        if silence.kind == "cut_off" and stopped != attempt.index:
            return None  # it stopped an earlier attempt (or none)
        if silence.kind != "cut_off" and silence.round != self._rdzv_round:
            return None  # a node of another round (this one was formed without it)
        if silence.kind != "cut_off" and not self._fixed_size():
            outvoted = self._stop_outvoted(wg, attempt, silence)
            if outvoted is not None:
                return outvoted
        if not self._fixed_size():
            what = "rejoining the rendezvous" if silence.kind == "cut_off" else "restarting the group at the new size"
            log.warning("%s: %s", silence.message, what)
            self.restart_group(wg)
            return RunResult(state=WorkerState.HEALTHY)
        log.error("%s: failing the group (--nnodes %d is fixed)", silence.message, self.settings.config.max_nodes)
        if silence.kind != "cut_off":
            self.collect_stacks(silence.message)
        for w in attempt.workers.values():
            if w.reason is None:
                w.reason, w.detail = "replica_lost", silence.message
            self._kill(w, signal.SIGKILL)
        return self._failed_by_silence(attempt)

    def _failed_by_silence(self, attempt: GroupStart | None) -> RunResult:
        if attempt is not None:
            attempt.state = FAILED
            attempt.ended_at = attempt.ended_at or time.time()
        self.remaining_restarts = 0  # the world cannot form again at this size
        return RunResult(state=WorkerState.FAILED)

    def _check_zygote(self, attempt: GroupStart) -> None:
        """Notice the zygote's death at once (one warning), and say at INFO which worker
        it declined to fork, and why (its wrapper exec'd it)."""
        assert self._zygote is not None
        for wrapper, why in self._zygote.fallbacks():
            ranks = [w.global_rank for w in attempt.workers.values() if w.pid == wrapper]
            who = f"rank {ranks[0]}" if ranks else "a worker"
            log.info("%s (pid %d) started by exec, not from the worker zygote: %s", who, wrapper, why)
        self._zygote.running()

    # -- stacks, hangs, progress ---------------------------------------------------------
    def collect_stacks(self, why: str) -> dict[int, RankStack]:
        """Take every live rank's Python stacks (all threads) before the agent stops the
        group (at most :data:`~torchstep.agent.stacks.COLLECT_TIMEOUT_S` in all), once per
        attempt: each worker record gets its :class:`RankStack`, the attempt a one-line
        summary and the file with every dump (``stacks.txt`` in the attempt's log directory).
        Safe from any thread.

        Args:
            why: what stops the group (the file's header).

        Returns:
            Global rank -> stack; empty when they were taken already or no rank is alive.
        """
        with self._stacks_lock:
            attempt = self.attempts[-1] if self.attempts else None
            if attempt is None or attempt.stacks_summary is not None:
                return {}
            live = [
                w
                for w in attempt.workers.values()
                if w.pid and w.exit is None and self._exits.get(w.pid) is None and w.stacks_file
            ]
            if not live:
                return {}
            started = time.monotonic()
            if self._nccl:
                request_nccl_dumps(attempt.log_dir)  # NCCL's own record of the collectives, if on
            stacks = collect([StackTarget(w.global_rank, w.pid, w.stacks_file) for w in live])  # type: ignore[arg-type]
            for w in live:
                w.stack = stacks.get(w.global_rank)
            attempt.stacks_summary = summary(stacks)
            path = os.path.join(attempt.log_dir, "stacks.txt")
            if os.path.isdir(attempt.log_dir) and write_file(path, why, stacks):
                attempt.stacks_file = path
            log.warning(
                "where the ranks were (%s; %.1fs): %s%s",
                why,
                time.monotonic() - started,
                attempt.stacks_summary,
                f"; every thread in {attempt.stacks_file}" if attempt.stacks_file else "",
            )
            return stacks

    def progress_now(self) -> dict[str, Any] | None:
        """The lowest rank's last ``torchstep.progress()`` report (the result's ``progress``)."""
        return self._progress.read()

    def _check_hang(self, attempt: GroupStart) -> None:
        """``--hang-timeout``: no rank printed, beat or progressed for that long: take the
        stacks and kill the ranks that hold the others up (all, when that cannot be told);
        the group then fails and restarts within the budget, as after an expired timer."""
        if self._hang is None or attempt.hang_fired or attempt.state != RUNNING:
            return
        idle = self._hang.expired()
        if idle is None:
            return
        alive = [w for w in attempt.workers.values() if w.pid and self._exits.get(w.pid) is None]
        if not alive:
            return
        attempt.hang_fired = True
        what = f"no progress for {idle:.1f}s (--hang-timeout {self._hang.timeout_s:g}s)"
        stacks = self.collect_stacks(what)
        culprits = outliers(stacks) or [w.global_rank for w in alive]
        where = attempt.stacks_summary or "no stack could be taken"
        for w in alive:
            if w.global_rank in culprits and w.reason is None:
                w.reason = "hang_timeout"
                w.detail = f"{what}: {where}"
                log.error("rank %d (pid %s): %s; killing its process group", w.global_rank, w.pid, w.detail)
                attempt.culprit_killed_at = attempt.culprit_killed_at or time.time()
                self._kill(w, signal.SIGKILL)

    def _check_heartbeats(self, attempt: GroupStart) -> None:
        if self._heartbeats is None:
            return
        alive = {lr for lr, w in attempt.workers.items() if w.pid and self._exits.get(w.pid) is None}
        for stale in self._heartbeats.stale(alive=alive):
            w = attempt.workers[stale.local_rank]
            if w.reason is not None:
                continue
            w.reason = "heartbeat_timeout"
            w.detail = (
                f"no torchstep.heartbeat() for {stale.age_s:.1f}s (--heartbeat-timeout {self._heartbeats.timeout_s:g}s)"
            )
            self.collect_stacks(f"rank {w.global_rank}: {w.detail}")
            if w.stack is not None:
                w.detail += f"; where the ranks were: {attempt.stacks_summary}"
            log.error("rank %d (pid %s): %s; killing its process group", w.global_rank, w.pid, w.detail)
            attempt.culprit_killed_at = attempt.culprit_killed_at or time.time()
            self._kill(w, signal.SIGKILL)

    def _on_timer_expired(self, pid: int, scope: str, sig: int) -> None:
        # runs in the timer server's thread
        attempt = self.attempts[-1] if self.attempts else None
        target = None
        if attempt is not None:
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                pgid = -1
            wrapper = wrapper_of(pid)  # a worker forked by the zygote: its rank is its wrapper's
            for w in attempt.workers.values():
                if w.pid == pid or (w.own_group and w.pid == pgid) or (wrapper is not None and w.pid == wrapper):
                    target = w
        if target is None:
            # not a current worker or one of its children: a timer left by a previous
            # attempt (its pid may already belong to someone else) — never kill it
            log.info("ignoring the expired timer %r of pid %s (not a current worker)", scope, pid)
            return
        if target.reason is None:
            target.reason = "timer_expired"
            target.detail = f"timer {scope!r} expired (torchstep.expires / timer.expires)"
            self.collect_stacks(f"rank {target.global_rank}: {target.detail}")
            if target.stack is not None and attempt is not None:
                target.detail += f"; where the ranks were: {attempt.stacks_summary}"
        log.error("rank %d (pid %s): %s; killing its process group", target.global_rank, target.pid, target.detail)
        if attempt is not None:
            attempt.culprit_killed_at = attempt.culprit_killed_at or time.time()
        self._kill(target, sig if sig > 0 else signal.SIGKILL)

    def _kill(self, w: WorkerRecord, sig: int) -> None:
        if w.pid is None:
            return
        if w.own_group:
            signal_group(w.pid, sig)
        else:
            try:
                os.kill(w.pid, sig)
            except ProcessLookupError:
                pass

    # -- stop / restart / exit -------------------------------------------------------------
    def _before_stop(self, attempt: GroupStart) -> None:
        if attempt.stop_started_at is not None:
            return
        for w in attempt.workers.values():
            # a zygote-forked worker has ended a moment before its exec wrapper does
            w.dead_before_stop = w.pid is not None and (exited_now(w.pid) or worker_ended(w.pid) is not None)
        attempt.stop_started_at = time.time()

    def stop_group(self, worker_group: WorkerGroup) -> None:
        self._watchdog.phase("stopping workers", self.settings.stop_timeout + 10)
        self.shutdown_group(signal.SIGTERM, self.settings.stop_timeout)

    def shutdown_group(self, death_sig: signal.Signals, timeout: float) -> None:
        self._ready.clear()  # back to the rendezvous (or out): not ready until a new world forms
        attempt = self.attempts[-1] if self.attempts else None
        if attempt is not None and not attempt.cleaned:
            self._before_stop(attempt)
        try:
            self.torch_shutdown(death_sig, timeout)
        finally:
            if attempt is not None and not attempt.cleaned:
                attempt.cleaned = True
                self._cleanup(attempt)

    def _cleanup(self, attempt: GroupStart) -> None:
        groups = [w.pid for w in attempt.workers.values() if w.pid and w.own_group]
        # the leaders are gone; their children (dataloaders, shells' children) may not be
        survivors = kill_groups(groups, wait_s=2.0)  # type: ignore[arg-type]
        if survivors:
            log.error("processes %s survived SIGKILL (uninterruptible sleep?)", survivors)
        for w in attempt.workers.values():
            if w.pid is None:
                continue
            info = self._exits.wait_for(w.pid, 2.0)
            code = self._returncode(w.local_rank)
            if info is None:
                info = ExitInfo(time.time(), code if code is not None else -1)
            elif code is not None:
                info = ExitInfo(info.time, code)
            ended = worker_ended(w.pid, forget=True)  # a zygote-forked worker: its own end, not its wrapper's
            if ended is not None and ended < info.time:
                info = ExitInfo(ended, info.exit_code)
            w.exit = info
            if w.own_group:
                if not any(p for p in survivors if _pgid(p) == w.pid):
                    self._reaper.forget_group(w.pid)
            else:
                self._reaper.forget_pid(w.pid)
        if attempt.state == RUNNING:
            attempt.state = CANCELLED if self.cancel_signal is not None else STOPPED
        attempt.ended_at = attempt.ended_at or time.time()
        if self._tee is not None:
            self._tee.stop()
            self._tee = None

    def _returncode(self, local_rank: int) -> int | None:
        return compat.worker_returncode(self.process_context, local_rank)

    def restart_group(self, worker_group: WorkerGroup) -> None:
        failed = worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY)
        if not failed:
            log.info("membership changed: restarting the group at the new size (not counted against the budget)")
        self.torch_restart_workers(worker_group)
        # counted once the new group has started: a restart cut short in its rendezvous (the
        # run stopped meanwhile, e.g. a peer's non-retryable failure) ran no worker again
        if failed:
            self.failure_restarts += 1
        else:
            self.membership_restarts += 1

    def exit_barrier_wait(self) -> None:
        self._watchdog.phase("exit barrier", self.exit_barrier_timeout_s + 10)
        self.torch_exit_barrier()

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        """torch's ``SimpleElasticAgent.run`` plus: graceful rendezvous exit is recorded
        (torch returns ``None`` there) and a second signal during the grace period kills
        every worker group at once."""
        start = time.monotonic()
        shutdown_called = False
        try:
            result: RunResult = self.run_loop(role)
            self.record_run(result, time.monotonic() - start)
            return result
        except RendezvousGracefulExitError as e:
            self.graceful_exit = str(e)
            log.info("rendezvous closed while this node was waiting: %s", e)
            return RunResult(state=WorkerState.SUCCEEDED)
        except RendezvousError as e:
            cut = self._liveness.cut_off if self._liveness is not None else None
            if cut is None:
                raise
            # the liveness monitor shut the store connection down: the step fails, retryable,
            # with the cut-off as its root cause (the workers were stopped with it)
            log.error("%s (%s: %s)", cut.message, type(e).__name__, e)
            attempt = self.attempts[-1] if self.attempts else None
            if attempt is not None:
                for w in attempt.workers.values():
                    if w.reason is None:
                        w.reason, w.detail = "replica_lost", cut.message
            return self._failed_by_silence(attempt)
        except SignalException as e:
            signals.acted_on()
            self.cancel_signal = int(e.sigval)
            log.warning(
                "received %s: forwarding it to the workers, SIGKILL after %gs",
                e.sigval.name,
                self.settings.grace_period,
            )
            self._escalate_on_next_signal()
            self._watchdog.phase("cancelling", self.settings.grace_period + 10)
            self.collect_stacks(f"the agent received {e.sigval.name}")
            self.shutdown_group(e.sigval, self.settings.grace_period)
            shutdown_called = True
            raise
        finally:
            self._ready.clear()
            if self._liveness is not None:
                self._liveness.stop()
            if not shutdown_called:
                self.shutdown_group(signal.SIGTERM, self.settings.grace_period)
            if self._timer_server is not None:
                self._timer_server.stop()
                self._timer_server = None
            self._worker_store = None
            self.set_elapsed(time.monotonic() - start)

    def _escalate_on_next_signal(self) -> None:
        def kill_now(signum: int, frame: FrameType | None) -> None:
            log.warning("received %s during the grace period: SIGKILL to every worker", signal.Signals(signum).name)
            self.kill_all_workers()

        for name in self.settings.config.signals_to_handle.split(","):
            sig = getattr(signal, name.strip(), None)
            if sig is not None:
                signal.signal(sig, kill_now)


def _pgid(pid: int) -> int:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return -1
