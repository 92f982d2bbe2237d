"""The local supervisor: every replica of every role is one ``torchstep-agent`` process on
this machine, all started together, supervised until the run ends, and never left behind.

What it owns (the agent owns the rest — worker restarts, per-rank logs, signal forwarding):

* one rendezvous per role on 127.0.0.1: a multi-replica role joins a store hosted by the
  supervisor (:mod:`torchstep.local.store`); a single-replica agent hosts its own on a port
  the kernel picks (``127.0.0.1:0``), so concurrent runs never collide;
* lost replicas: an agent that dies of a signal it could not handle (SIGKILL, OOM) is a
  lost node — its orphaned workers are killed and, while the role's REPLICA budget lasts,
  a new agent takes its place and joins the rendezvous (it gets ``--max-restarts`` = what
  is left of the budget, so the supervisor and the agents spend one budget). An agent that
  *exits* — budget spent, non-retryable failure — is final: the run fails;
* stop: cancel / timeout / a failed replica → SIGTERM to every agent's process group, the
  grace period, then SIGKILL of every process tagged with the run's token;
* the aggregated :class:`~torchstep.StepResult`, written to ``<log_dir>/<app_id>/result.json``.

Nothing a full disk does to a file changes the outcome: each agent also leaves its result's
summary in the supervisor's private temporary directory (``TORCHSTEP_TERMINATION_LOG``), read
when its replica's ``result.json`` could not be written; a run result that cannot be written
is still returned (and printed), its ``warnings`` naming every file that was truncated or
not written.
"""

from __future__ import annotations

import contextlib
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from torchstep import contract
from torchstep.agent import procs
from torchstep.checkpoints import latest_checkpoint
from torchstep.contract import NON_RETRYABLE_EXIT_CODE, TIMEOUT_EXIT_CODE, signal_name
from torchstep.errors import SpecError
from torchstep.files import UnsafePathError, open_private
from torchstep.local.options import LocalOptions
from torchstep.local.prepare import LOCALHOST, ReplicaSpec, app_dir, prepare, with_restarts
from torchstep.local.rundir import claim_run_dir
from torchstep.local.status import PlainDisplay, ReplicaEvent, StatusCallback
from torchstep.plan import agent_command
from torchstep.plan.model import RetryOwner, StepPlan
from torchstep.plan.names import short_id
from torchstep.result import (
    CANCELLED,
    FAILED,
    PENDING,
    RUNNING,
    SUCCEEDED,
    TERMINAL_STATES,
    RankResult,
    ReplicaResult,
    StepResult,
    is_final_failure,
    is_retryable,
    merge,
    replica_state,
    root_cause_line,
    where_ranks_were,
)
from torchstep.untrusted import MAX_SUMMARY_READ_BYTES, escape_control_bytes, read_capped

#: How the supervisor starts the agent (``python -m torchstep.agent``, the interpreter running
#: the supervisor: no dependence on PATH).
AGENT_COMMAND: tuple[str, ...] = (sys.executable, "-m", "torchstep.agent")
#: The most bytes of an agent's console line read at once (a longer line comes in pieces).
_LINE_PIECE = 64 * 1024
#: Exit code of a run stopped by its timeout (as GNU ``timeout``).


def _checkpoint_dir(path: str) -> list[str]:
    """Create the step's checkpoint directory (0700) or check the existing one and every
    directory above it (:func:`torchstep.checkpoints.prepare_checkpoint_dir`); the
    warnings to show."""
    from torchstep.checkpoints import prepare_checkpoint_dir
    from torchstep.files import UnsafePathError

    try:
        return prepare_checkpoint_dir(path)
    except UnsafePathError as e:
        raise SpecError("cfg['checkpoint_dir']", "local", f"{e.path}: {e.problem}", fix=e.fix) from None


def write_run_result(result: StepResult, path: str, display: PlainDisplay) -> bool:
    """Write the run's result to ``path``; when a full disk (or any write error) stops it,
    the result in memory says so (``result not written: <path>: <reason>``) and the run
    still ends with its own outcome.

    Args:
        result: the run's result (its warnings get the failure).
        path: the result file.
        display: where the failure is said.

    Returns:
        Whether it was written.
    """
    try:
        result.write(path)
        return True
    except OSError as e:
        note = f"result not written: {path}: {e.strerror or e}"
        if note not in result.warnings:
            result.warnings.append(note)
        display.note(note)
        return False


def new_app_id(name: str) -> str:
    """``<name>-<short id>``, unique per run; safe as a directory name.

    Args:
        name: the app's name.

    >>> new_app_id("my app/v2")[:10], len(new_app_id("x"))
    ('my-app-v2-', 8)
    """
    safe = "".join("-" if (c in "/\\" or c.isspace() or not c.isprintable()) else c for c in name).strip(".-")
    return f"{safe[:60] or 'app'}-{short_id(6)}"


@dataclass
class _Replica:
    spec: ReplicaSpec
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    state: str = PENDING
    exit_code: int | None = None
    replaced: int = 0  # lost agents replaced so far
    lost: RankResult | None = None  # set when a loss ended this replica (budget spent)
    stopped: bool = False  # stopped by the supervisor (cancel, timeout, failure elsewhere)
    dropped: bool = False  # lost, not replaced, and its elastic role went on without it
    threads: list[threading.Thread] = field(default_factory=list)


class Supervisor:
    """One attempt of a local run (:func:`torchstep.local.run_plan`, under :class:`torchstep.steps.LocalStep`).

    Args:
        plan: a plan for the ``local`` target.
        opts: the run's options.
        app_id: the run's id; ``None``: :func:`new_app_id` of the app's name.
        on_status: called with every replica's change of state.
        cancel: set it to stop the run (CANCELLED); ``None``: a new event.
        kill: set it to skip the grace period while stopping; ``None``: a new event.
        display: where progress goes; ``None``: plain lines on stdout.
        attempt: the try's number, from 1.
    """

    def __init__(
        self,
        plan: StepPlan,
        opts: LocalOptions,
        *,
        app_id: str | None = None,
        on_status: StatusCallback | None = None,
        cancel: threading.Event | None = None,
        kill: threading.Event | None = None,
        display: PlainDisplay | None = None,
        attempt: int = 1,
    ) -> None:
        self.plan = plan
        self.opts = opts
        self.app_id = app_id or new_app_id(plan.app_name)
        self.on_status = on_status
        self.cancel = cancel or threading.Event()
        self.kill = kill or threading.Event()  # set while stopping: no more grace
        self.display = display or PlainDisplay(show_output=opts.tee)
        self.attempt = attempt
        self.dir = app_dir(opts, self.app_id)
        self.token = f"{self.app_id}.{os.getpid()}.{short_id(8)}"
        # names the state key in the rendezvous store: unguessable, and passed in the agents'
        # environment (owner-only in /proc), never on their command line
        self.rdzv_secret = secrets.token_hex(8)
        # signs the rendezvous state (torchstep.agent.rdzv_guard): one per run, handed to its
        # agents in the environment only, so another local user who reaches the store cannot
        # write a state they accept
        self.rdzv_key = secrets.token_hex(32)
        self.events: queue.Queue[tuple[tuple[str, int], int, int, float]] = queue.Queue()
        self.replicas: dict[tuple[str, int], _Replica] = {}
        self.rdzv: dict[str, tuple[str, str]] = {}  # role -> (endpoint, conf)
        self.replaced: dict[str, int] = {}  # role -> replacements (spent from its budget)
        self.role_restarts: dict[str, int] = {}  # role -> restarts of the whole role (ROLE policy)
        self.failure: _Replica | None = None
        self.reason: str | None = None  # "cancelled" | "timeout"
        self.timeout_s: float | None = None
        self._callback_failed = False
        self.warnings: list[str] = []
        self._warn_lock = threading.Lock()

    # -- public ---------------------------------------------------------------------------
    def run(self) -> StepResult:
        """Start every replica, supervise, stop, aggregate.

        Returns:
            The run's merged result.

        Raises:
            SpecError: before starting anything, when this machine cannot serve the plan.
        """
        prepared = prepare(self.plan, self.opts, app_id=self.app_id)
        if self.opts.checkpoint_dir is not None:
            for text in _checkpoint_dir(self.opts.checkpoint_dir):
                self._warn(text)
        lock = claim_run_dir(self.opts.log_dir, self.dir, [spec.log_dir for spec in prepared.replicas], self.app_id)
        try:
            return self._run(prepared)
        finally:
            os.close(lock)  # releases the run directory's lock

    def _run(self, prepared: Any) -> StepResult:
        for note in prepared.notes:
            self.display.note(note)
        for spec in prepared.replicas:
            self.replicas[spec.key] = _Replica(spec)
        self.display.begin(self.app_id, self.dir)
        started = time.time()
        from torchstep.local.store import StoreHost

        multi = [r for r in self.plan.roles if r.num_replicas > 1]
        store = StoreHost(len(multi))
        interrupted: BaseException | None = None
        self.tmp = tempfile.mkdtemp(prefix="torchstep-launch-")  # 0700; the agents' run state
        try:
            for role, port in zip(multi, store.ports, strict=True):
                self.rdzv[role.name] = (f"{LOCALHOST}:{port}", "is_host=false")
            for role in self.plan.roles:  # one replica: its agent hosts the store on a free port
                self.rdzv.setdefault(role.name, (f"{LOCALHOST}:0", ""))
            if multi:
                store.start({**prepared.env, procs.ENV_TOKEN: f"{self.token}/store"})
            for rep in self.replicas.values():
                self._emit(rep, PENDING)
            for rep in self.replicas.values():
                self._spawn(rep)
            self._supervise(started)
        except KeyboardInterrupt as e:  # cancelling the Python call with Ctrl-C
            interrupted = e
            self.reason = self.reason or "cancelled"
        finally:
            try:
                self._stop_all()
            except KeyboardInterrupt:  # a second Ctrl-C: no more grace
                procs.kill_tagged(self.token + "/")
            store.stop()
            procs.kill_tagged(self.token + "/")
            for rep in self.replicas.values():
                for t in rep.threads:
                    t.join(timeout=5)
        try:
            result = self._result(started, time.time())
        finally:  # after the result: the agents' summaries are in there
            shutil.rmtree(self.tmp, ignore_errors=True)
        write_run_result(result, os.path.join(self.dir, "result.json"), self.display)
        if interrupted is not None:
            raise interrupted
        return result

    # -- processes ------------------------------------------------------------------------
    def _spawn(self, rep: _Replica) -> None:
        spec = rep.spec
        role = spec.role
        budget_left = role.retry.agent_restarts - self.replaced.get(role.name, 0)
        if rep.incarnation:
            role = with_restarts(role, budget_left)
        endpoint, conf = self.rdzv[role.name]
        # a restarted role re-forms its group under a new id (a closed rendezvous stays closed)
        n = self.role_restarts.get(role.name, 0)
        rdzv_id = f"{self.app_id}-{role.name}-{self.rdzv_secret}" + (f"-r{n}" if n else "")
        env = dict(spec.env)
        env[contract.ENV_RUN_DIR] = self.tmp
        if self.opts.checkpoint_dir is not None:  # looked up per start: a replaced replica resumes too
            env[contract.ENV_CHECKPOINT_DIR] = self.opts.checkpoint_dir
            env[contract.ENV_LAST_CHECKPOINT] = self._last_checkpoint(self.opts.checkpoint_dir)
        env[procs.ENV_TOKEN] = f"{self.token}/r/{role.name}/{spec.replica_id}/{rep.incarnation}"
        env[contract.ENV_RDZV_ID] = rdzv_id
        env[contract.ENV_RDZV_KEY] = self.rdzv_key
        # every replica is on this machine: the workers' store address is loopback, so the
        # agent that hosts it listens on loopback only (torchstep.agent.stores)
        env.setdefault("PET_LOCAL_ADDR", LOCALHOST)
        if role.uses_torchrun:
            env.update(
                {
                    contract.ENV_RDZV_ENDPOINT: endpoint,
                    contract.ENV_RDZV_BACKEND: "c10d",
                }
            )
            if conf:
                env[contract.ENV_RDZV_CONF] = conf
            if rep.incarnation and role.retry.owner is RetryOwner.AGENT:
                env["PET_MAX_RESTARTS"] = str(max(0, budget_left))
        extra = ["--rdzv-conf", conf] if conf else []
        argv = agent_command.agent_argv(
            role,
            rdzv_endpoint=endpoint,
            rdzv_id=None,  # in env above: other users read command lines in /proc
            agent=AGENT_COMMAND,
            replica_args=agent_command.macro_values(self.app_id, spec.replica_id, img_root=spec.img_root),
            extra=extra,
        )
        # the agent's result summary, here as well: read when its result.json cannot be written
        env[contract.ENV_TERMINATION_LOG] = self._summary_file(rep)
        for stale in (spec.result_file, self._summary_file(rep)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)  # a result left by a lost predecessor is not ours
        proc = procs.spawn(argv, env=env, cwd=spec.cwd, cpus=spec.cpus)
        rep.proc, rep.state, rep.exit_code = proc, RUNNING, None
        inc = rep.incarnation
        pump = threading.Thread(target=self._pump, args=(rep, proc), daemon=True, name=f"torchstep-out-{proc.pid}")
        waiter = threading.Thread(
            target=lambda: self.events.put((spec.key, inc, proc.wait(), time.time())),
            daemon=True,
            name=f"torchstep-wait-{proc.pid}",
        )
        rep.threads += [pump, waiter]
        pump.start()
        waiter.start()
        self._emit(rep, RUNNING, pid=proc.pid)

    def _pump(self, rep: _Replica, proc: subprocess.Popen[bytes]) -> None:
        """Copy the agent's output to agent.log and (tee) to the display, line by line."""
        assert proc.stdout is not None
        log: Any = None
        try:
            log = os.fdopen(open_private(rep.spec.console_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
        except OSError as e:
            self._log_lost(rep, e)
        try:
            # read to EOF whatever happens to the log: the agent never blocks on a full pipe
            # a line is read in pieces of at most _LINE_PIECE bytes: one endless line from a
            # worker costs the supervisor that much memory, not the line's size
            stdout = proc.stdout
            for piece in iter(lambda: stdout.readline(_LINE_PIECE), b""):
                raw = escape_control_bytes(piece)  # what the agent let through is shown, never obeyed
                if log is not None:
                    try:
                        log.write(raw)
                        log.flush()
                    except OSError as e:  # disk full, file too large, I/O error
                        self._log_lost(rep, e)
                        with contextlib.suppress(OSError):
                            log.close()
                        log = None
                self.display.line(raw.decode("utf-8", "replace").rstrip("\r\n"))
        finally:
            if log is not None:
                with contextlib.suppress(OSError):
                    log.close()
            proc.stdout.close()

    def _log_lost(self, rep: _Replica, err: OSError) -> None:
        """A log that cannot be written is truncated, not fatal: the console keeps every
        line and the result says so."""
        self._warn(f"log truncated: {rep.spec.console_file}: {err.strerror or err}")

    def _warn(self, text: str) -> None:
        """Say ``text`` once: on the console and in the result's warnings."""
        with self._warn_lock:
            if text in self.warnings:
                return
            self.warnings.append(text)
        self.display.note(text)

    def _last_checkpoint(self, directory: str) -> str:
        """The newest checkpoint a starting replica resumes from (checked now: see
        :mod:`torchstep.checkpoints`); ``""`` when none can be trusted, and a warning says why."""
        try:
            return latest_checkpoint(directory, warn=self._warn) or ""
        except UnsafePathError as e:
            self._warn(f"no checkpoint is resumed from: {e}")
            return ""

    def _supervise(self, started: float) -> None:
        limits = [t for t in (self.opts.timeout, self.plan.timeout_s, *(r.timeout_s for r in self.plan.roles)) if t]
        self.timeout_s = min(limits) if limits else None
        deadline = started + self.timeout_s if self.timeout_s else None
        while True:
            if self.cancel.is_set():
                self.reason = "cancelled"
                return
            if deadline is not None and time.time() > deadline:
                self.reason = "timeout"
                return
            try:
                key, incarnation, rc, ts = self.events.get(timeout=0.1)
            except queue.Empty:
                continue
            rep = self.replicas[key]
            if incarnation != rep.incarnation:
                continue  # an agent already replaced
            tag = f"{self.token}/r/{key[0]}/{key[1]}/{incarnation}"
            procs.kill_tagged(tag)  # its workers die with it, even when it was SIGKILLed
            if rc == 0:
                rep.state, rep.exit_code = replica_state(0, reported=self._reported_state(rep)), 0
                self._emit(rep, rep.state, exit_code=0)
                if self._all_done():
                    return
            elif self._restart_role(rep, rc):
                continue
            elif rc < 0:
                if not self._replace(rep, rc, ts):
                    return
            else:
                rep.state, rep.exit_code = replica_state(rc, reported=self._reported_state(rep)), rc
                self.failure = rep
                self._emit(rep, rep.state, exit_code=rc)
                return

    def _restart_role(self, rep: _Replica, rc: int) -> bool:
        """ROLE policy (TorchX nightly): a failed or lost replica restarts every replica of
        its role, while the role's budget lasts. False when the policy does not apply."""
        name = rep.spec.role.name
        budget = self.plan.role(name).retry.role_retries
        used = self.role_restarts.get(name, 0)
        if used >= budget or rc == NON_RETRYABLE_EXIT_CODE:
            return False
        self.role_restarts[name] = used + 1
        code = rc if rc >= 0 else 128 - rc
        self._emit(rep, FAILED, exit_code=code, message=f"restarting role {name!r} ({used + 1}/{budget} of the budget)")
        peers = [r for r in self.replicas.values() if r.spec.role.name == name]
        self._stop(peers, emit=False)
        for peer in peers:
            peer.stopped = False
            peer.replaced += 1
            peer.incarnation += 1
            self._spawn(peer)
        return True

    def _replace(self, rep: _Replica, rc: int, ts: float) -> bool:
        """A lost agent: replace it while the role's budget lasts. False when the run ends."""
        role = rep.spec.role
        used = self.replaced.get(role.name, 0)
        budget = role.retry.agent_restarts
        sig = signal_name(rc)
        code = 128 - rc  # what a shell reports for a death by signal -rc
        what = f"agent of {role.name} replica {rep.spec.replica_id} (pid {rep.proc.pid if rep.proc else '?'}) died of {sig}"
        if used < budget:
            self.replaced[role.name] = used + 1
            self._emit(
                rep, FAILED, exit_code=code, message=f"{what}: lost, replacing it ({used + 1}/{budget} of the budget)"
            )
            rep.replaced += 1
            rep.incarnation += 1
            self._spawn(rep)
            return True
        why = "the role's retry budget is spent" if budget else f"no REPLICA budget ({role.retry.policy} policy)"
        rep.state, rep.exit_code = FAILED, code
        rep.lost = RankResult(
            role=role.name,
            rank=-1,
            local_rank=-1,
            state=FAILED,
            exit_code=code,
            signal=sig,
            message=f"{what}: replica lost and not replaced, {why}",
            timestamp=ts,
            reason="replica_lost",
            replica_id=rep.spec.replica_id,
            log_file=rep.spec.console_file,
        )
        survivors = [
            r for r in self.replicas.values() if r.spec.role.name == role.name and r is not rep and not r.dropped
        ]
        if role.elastic and len(survivors) >= role.min_replicas:
            # the elastic rendezvous re-forms the group without it (torchrun's semantics)
            rep.dropped = True
            rep.lost.message = (
                f"{rep.lost.message}; the elastic role may go on with {len(survivors)} replica(s) "
                f"(min {role.min_replicas}) while its agents have restarts left"
            )
            self._emit(rep, FAILED, exit_code=code, message=rep.lost.message)
            return not self._all_done()
        self.failure = rep
        self._emit(rep, FAILED, exit_code=code, message=rep.lost.message)
        return False

    def _all_done(self) -> bool:
        """Every replica succeeded, except lost ones an elastic role went on without."""
        return all(r.state == SUCCEEDED or r.dropped for r in self.replicas.values())

    def _stop_all(self) -> None:
        self._stop(list(self.replicas.values()))

    def _stop(self, reps: list[_Replica], *, emit: bool = True) -> None:
        """SIGTERM the process group of each live agent of ``reps``, wait the grace period,
        then SIGKILL every process they started."""
        live = [r for r in reps if r.proc is not None and r.proc.poll() is None]
        for rep in live:
            rep.stopped = True
            assert rep.proc is not None
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(rep.proc.pid, signal.SIGTERM)
        tags = [f"{self.token}/r/{r.spec.role.name}/{r.spec.replica_id}/{r.incarnation}" for r in live]
        # the agent needs the grace period for its workers, then a moment to write its result
        deadline = time.monotonic() + self.opts.grace_period + 5
        while live and time.monotonic() < deadline and not self.kill.is_set():
            if all(r.proc is not None and r.proc.poll() is not None for r in live) and not procs.tagged_pids(*tags):
                break
            time.sleep(0.1)
        for tag in tags:
            procs.kill_tagged(tag)
        for rep in reps:  # every agent that ended without its own status line yet (stopped or not)
            if rep.proc is None or (rep not in live and (not emit or rep.state != RUNNING)):
                continue
            try:
                rc = rep.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                continue
            if rep.state == RUNNING and emit:
                code = rc if rc >= 0 else 128 - rc
                # the result's rule: workers that failed on their own before the stop reached
                # their agent make the replica FAILED, not CANCELLED
                state = replica_state(code, reported=self._reported_state(rep), stopped=rep in live)
                rep.state, rep.exit_code = state, code
                self._emit(rep, state, exit_code=code)

    # -- status ---------------------------------------------------------------------------
    def _emit(
        self,
        rep: _Replica,
        state: str,
        *,
        exit_code: int | None = None,
        pid: int | None = None,
        message: str | None = None,
    ) -> None:
        ev = ReplicaEvent(
            app_id=self.app_id,
            role=rep.spec.role.name,
            replica_id=rep.spec.replica_id,
            state=state,
            exit_code=exit_code,
            ts=time.time(),
            pid=pid,
            incarnation=rep.incarnation,
            message=message,
        )
        self.display.event(ev)
        if self.on_status is not None:
            try:
                self.on_status(ev)
            except Exception as e:  # a broken callback must not orphan processes
                if not self._callback_failed:
                    self._callback_failed = True
                    self.display.note(f"on_status callback raised {type(e).__name__}: {e} (ignored)")

    # -- result ---------------------------------------------------------------------------
    def _summary_file(self, rep: _Replica) -> str:
        spec = rep.spec
        return os.path.join(self.tmp, f"{spec.role_index}.{spec.replica_id}.{rep.incarnation}.summary")

    def _reported(self, rep: _Replica) -> StepResult | None:
        """The agent's own word on ``rep``: its ``result.json``, unless that is missing or not
        final and the summary it left in the supervisor's directory is (a full disk)."""
        spec = rep.spec
        loaded: StepResult | None = None
        try:  # never through a symlink, never blocking, capped: the workers could write there
            loaded = StepResult.load(spec.result_file)
        except FileNotFoundError:
            loaded = None
        except (OSError, ValueError) as e:
            self._warn(f"{spec.role.name} replica {spec.replica_id}: the agent's result was not read: {e}")
            loaded = None
        if loaded is not None and loaded.replicas and loaded.state in TERMINAL_STATES:
            return loaded
        data, why = read_capped(self._summary_file(rep), MAX_SUMMARY_READ_BYTES, what="result summary")
        summary, notes = StepResult.read_summary(data.decode("utf-8", "replace") if data is not None else None)
        for note in [*([why] if why else []), *notes]:
            self._warn(f"{spec.role.name} replica {spec.replica_id}: {note}")
        if summary is None or summary.state not in TERMINAL_STATES:
            return loaded
        root = summary.root_cause
        summary.replicas = [
            ReplicaResult(
                role=spec.role.name,
                replica_id=spec.replica_id,
                state=summary.state,
                exit_code=summary.exit_code,
                restarts=summary.restarts,
                ranks=[root] if root is not None else [],
                log_dir=spec.log_dir,
                message=summary.message,
            )
        ]
        summary.log_dir = spec.log_dir
        return summary

    def _reported_state(self, rep: _Replica) -> str | None:
        reported = self._reported(rep)
        return reported.state if reported is not None else None

    def _replica_result(self, rep: _Replica) -> StepResult:
        spec = rep.spec
        loaded = self._reported(rep)
        state = rep.state if rep.state in (SUCCEEDED, FAILED, CANCELLED) else FAILED
        final = loaded is not None and loaded.replicas and loaded.state in (SUCCEEDED, FAILED, CANCELLED)
        if loaded is not None and loaded.replicas and (not final or rep.lost):
            # the agent died before its final word (its reaper may have marked it): the
            # supervisor knows better
            loaded.state, loaded.exit_code = state, rep.exit_code
            for r in loaded.replicas:
                r.state, r.exit_code = state, rep.exit_code
        if loaded is None or not loaded.replicas:
            msg = None if rep.lost else f"no result file from the agent (exit code {rep.exit_code})"
            loaded = StepResult(
                app_id=self.app_id,
                state=state,
                exit_code=rep.exit_code,
                root_cause=rep.lost,
                message=msg if state != SUCCEEDED else None,
                replicas=[ReplicaResult(role=spec.role.name, replica_id=spec.replica_id, state=state)],
            )
        for r in loaded.replicas:
            r.role, r.replica_id = spec.role.name, spec.replica_id
            r.log_dir = r.log_dir or spec.log_dir
            r.result_file = spec.result_file
            r.restarts += rep.replaced
            if rep.replaced:
                r.message = (r.message + "; " if r.message else "") + f"agent replaced {rep.replaced} time(s)"
        if rep.lost is not None:
            loaded.root_cause = rep.lost
        loaded.restarts += rep.replaced
        if not final:  # the replica's own result file says what happened, whatever killed its agent
            if rep.exit_code is not None and rep.exit_code < 0 and not loaded.message:
                loaded.message = f"the agent was killed by {signal_name(rep.exit_code)}"
            with contextlib.suppress(OSError):
                loaded.write(spec.result_file)
        return loaded

    def _result(self, started: float, ended: float) -> StepResult:
        parts = {k: self._replica_result(r) for k, r in self.replicas.items()}
        result = merge(
            self.app_id,
            list(parts.values()),
            started_at=started,
            ended_at=ended,
            attempts=self.attempt,
            log_dir=self.dir,
        )
        # the supervisor knows why the run ended: replicas it stopped are not failures
        failed = self.failure
        own = [parts[k] for k, r in self.replicas.items() if not r.stopped]
        non_retryable = any(
            is_final_failure(p) or p.exit_code == NON_RETRYABLE_EXIT_CODE for p in own if p.state != SUCCEEDED
        )
        if self.reason == "cancelled":  # workers killed by our SIGTERM are no root cause
            result.state, result.root_cause = CANCELLED, None
            result.message = "cancelled"
        elif self.reason == "timeout":
            result.state = FAILED
            result.message = f"timed out after {self.timeout_s:g} s; every process was stopped"
            result.exit_code, result.root_cause = TIMEOUT_EXIT_CODE, None
        elif failed is not None:
            part = parts[failed.spec.key]
            result.state = FAILED
            result.exit_code = part.exit_code if part.exit_code not in (None, 0) else failed.exit_code
            # a lost replica that could not be replaced is the cause; else the earliest
            # failure of any replica (merge's pick), else the replica that ended the run
            result.root_cause = failed.lost or result.root_cause or part.root_cause
            rc = result.root_cause
            result.message = root_cause_line(rc) if rc is not None else part.message
        elif self._all_done():
            result.state, result.exit_code = SUCCEEDED, 0
            dropped = [r.lost.message for r in self.replicas.values() if r.dropped and r.lost and r.lost.message]
            result.message = "; ".join(dropped) or None
        else:  # the run did not end in any of these ways: merge's verdict stands
            non_retryable = not result.retryable
        if self.reason in ("cancelled", "timeout") and (where := where_ranks_were(result)):
            result.message = f"{result.message}; where the ranks were: {where}"  # the agents' stacks
        if result.state == SUCCEEDED:
            result.root_cause = None
        result.retryable = is_retryable(result.state, non_retryable=non_retryable)  # the one rule
        result.warnings = [*result.warnings, *(w for w in self.warnings if w not in result.warnings)]
        return result
