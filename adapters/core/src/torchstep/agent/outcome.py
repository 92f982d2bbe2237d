"""From what happened to the step result (``torchstep.result.StepResult``) and the exit code.

Exit codes (docs/agent.md):

====================  ================================================================
0                     every worker succeeded
N (1..255)            the root-cause worker exited with N (torchrun always exits 1)
128 + S               the root-cause worker was killed by signal S (137: SIGKILL, e.g. a
                      timer or heartbeat kill), or the agent was cancelled by S (143:
                      SIGTERM) — the result's state tells which (FAILED vs CANCELLED)
82                    non-retryable failure (``NON_RETRYABLE_EXIT_CODE``)
83                    the agent failed itself: rendezvous timeout/closed, watchdog, error
2                     bad command line or environment value
====================  ================================================================

Example::

    >>> from torchstep.agent.results import exit_code_for
    >>> exit_code_for(exit_code=-9), exit_code_for(exit_code=3)
    (137, 3)
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchstep.agent.hang import nccl_dumps
from torchstep.contract import (
    AGENT_ERROR_EXIT_CODE,
    ENV_TERMINATION_LOG,
    NON_RETRYABLE_EXIT_CODE,
    USAGE_EXIT_CODE,
    error_details,
    is_non_retryable,
    signal_name,
)
from torchstep.files import private_dir
from torchstep.result import (
    CANCELLED,
    FAILED,
    RUNNING,
    SUCCEEDED,
    TAIL_LINES,
    TERMINAL_STATES,
    UNKNOWN,
    RankResult,
    ReplicaResult,
    StepResult,
    earliest_failure,
    is_retryable,
    root_cause_line,
)
from torchstep.untrusted import (
    MAX_ERROR_FILE_BYTES,
    MAX_MESSAGE_CHARS,
    MAX_OUTPUTS_BYTES,
    MAX_TAIL_LINE_BYTES,
    MAX_TRACEBACK_CHARS,
    cut,
    read_json_file,
)

if TYPE_CHECKING:
    from torchstep.agent.elastic import GroupStart, TorchstepAgent, WorkerRecord
    from torchstep.agent.settings import AgentSettings


@dataclass
class Outcome:
    """How the agent's run ended, before it is turned into a result.

    ``kind``: ``workers`` (the group finished or failed), ``cancelled`` (signal),
    ``rendezvous`` (timeout, closed, backend unreachable), ``watchdog``, ``agent_error``,
    ``usage`` (bad command line).

    Example: ``Outcome("cancelled", signal=15)`` becomes state CANCELLED, exit code 143.
    """

    kind: str
    succeeded: bool = False
    signal: int | None = None
    message: str | None = None


def exit_code_for(*, exit_code: int | None) -> int:
    """A worker's exit code as the agent's: N stays N, killed by signal S gives 128+S.

    Example::

        >>> exit_code_for(exit_code=-15)
        143
    """
    if exit_code is None:
        return AGENT_ERROR_EXIT_CODE
    if exit_code < 0:
        return 128 + (-exit_code)
    return exit_code


def _read_json(path: str, max_bytes: int, what: str, notes: list[str] | None) -> Any:
    """A JSON file the worker controls (its error or outputs file), read by the one reader
    (:func:`torchstep.untrusted.read_json_file`: no symlink followed, no FIFO blocked on,
    capped, depth-limited); what is refused becomes a warning in ``notes``."""
    value, why = read_json_file(path, max_bytes, what=what)
    if notes is not None:
        notes.extend(n for n in why if n not in notes)
    return value


def _error_details(data: Any, code: int | None, notes: list[str] | None) -> tuple[str | None, str | None, bool]:
    """``(message, traceback, non_retryable)`` from an error file's data, whatever shape a
    worker gave it (a field of the wrong type is dropped), each cut to its cap."""
    try:
        message, trace = error_details(data)
        non_retryable = is_non_retryable(code, data)
    except (AttributeError, TypeError, ValueError):
        if notes is not None:
            notes.append("a worker's error file has fields of the wrong type: its message and traceback were dropped")
        return None, None, is_non_retryable(code, None)
    message = cut(message, MAX_MESSAGE_CHARS) if isinstance(message, str) else None
    if isinstance(trace, str) and len(trace) > MAX_TRACEBACK_CHARS:  # keep its end: the exception
        trace = f"[{len(trace) - MAX_TRACEBACK_CHARS} characters cut] …{trace[-MAX_TRACEBACK_CHARS:]}"
    return message, trace if isinstance(trace, str) else None, non_retryable


def rank_result(
    attempt: GroupStart, w: WorkerRecord, *, role: str, replica_id: int, notes: list[str] | None = None
) -> RankResult:
    """One worker of ``attempt`` as a :class:`RankResult`; what of its error file was
    refused (a symlink, a FIFO, too large, too deep) is added to ``notes``.

    Example: ``rank_result(agent.attempts[-1], worker, role="trainer", replica_id=0).reason``
    is e.g. ``"timer_expired"``.
    """
    code = w.exit.exit_code if w.exit is not None else None
    killed_at = attempt.culprit_killed_at
    collateral = w.reason is None and (
        (attempt.stop_started_at is not None and not w.dead_before_stop)
        # died after the agent killed a rank it named: of that kill (a broken collective)
        or (killed_at is not None and w.exit is not None and w.exit.time >= killed_at)
    )
    data = (
        _read_json(w.paths.error, MAX_ERROR_FILE_BYTES, f"rank {w.global_rank}'s error file", notes)
        if code not in (None, 0)
        else None
    )
    message, trace, non_retryable = _error_details(data, code, notes)
    if attempt.state == CANCELLED and code != 0:
        state = CANCELLED
    elif code == 0:
        state = SUCCEEDED
    elif code is None:
        state = UNKNOWN if attempt.state != RUNNING else RUNNING
    else:
        state = FAILED
    reason = None
    if state == CANCELLED:
        reason = "cancelled"
    elif state == FAILED:
        if w.reason:
            reason = w.reason
        elif non_retryable:  # before "stopped": a rank killed while exiting after it raised
            reason = "non_retryable"
        elif collateral:
            reason = "stopped"
        elif code is not None and code < 0:
            reason = "signal"
        else:
            reason = "worker_failed"
    if message is None and state in (FAILED, CANCELLED):
        if w.detail:
            message = w.detail
        elif reason == "stopped":
            message = f"stopped by the agent after another rank failed ({signal_name(code) or f'exit {code}'})"
        elif code is not None and code < 0:
            message = f"killed by {signal_name(code)}"
        else:
            message = f"exited with code {code}"
    timestamp = None
    if state in (FAILED, CANCELLED) and w.exit is not None:
        timestamp = w.exit.time
        stop = attempt.stop_started_at
        if stop is not None:
            # ranks that died on their own come before those the agent stopped afterwards
            timestamp = min(timestamp, stop) if not collateral else max(timestamp, stop + 1e-3)
    failed = state in (FAILED, CANCELLED)
    return RankResult(
        role=role,
        rank=w.global_rank,
        local_rank=w.local_rank,
        state=state,
        exit_code=code,
        signal=signal_name(code),
        message=message,
        traceback=trace,
        timestamp=timestamp,
        reason=reason,
        replica_id=replica_id,
        log_file=w.paths.log,
        tail=_tail(w) if failed else [],
        stack=w.stack.result_lines() if w.stack is not None else [],
        waiting_in=w.stack.waiting_in if w.stack is not None else None,
        where=w.stack.where if w.stack is not None else None,
    )


def _tail(w: WorkerRecord) -> list[str]:
    """The last lines of a worker: what the tee saw (complete even when a full disk
    truncated the log file), else the log file's end (a ``--logs-specs`` of the user's)."""
    if w.tails:
        for stream in ("err", "out"):  # split streams: the traceback is on stderr
            lines = list(w.tails.get(stream) or [])
            if lines:
                return _capped(lines[-TAIL_LINES:])
        return []
    from torchstep.agent.logs import tail_lines

    if w.paths.stderr:
        lines = tail_lines(w.paths.stderr, TAIL_LINES)
        if lines:
            return _capped(lines)
    return _capped(tail_lines(w.paths.log, TAIL_LINES))


def _capped(lines: list[str]) -> list[str]:
    """Each line cut to :data:`~torchstep.untrusted.MAX_TAIL_LINE_BYTES` characters (a
    line the tee cut already, its marker included, is left as it is)."""
    return [line if len(line) <= MAX_TAIL_LINE_BYTES + 64 else cut(line, MAX_TAIL_LINE_BYTES) or "" for line in lines]


def _summary(rank: RankResult) -> str:
    what = rank.reason or "failed"
    return f"rank {rank.rank} {what} ({rank.signal or f'exit {rank.exit_code}'}): {root_cause_line(rank)}"


def _outputs(attempts: list[GroupStart], notes: list[str]) -> dict[str, Any]:
    """Rank 0's outputs of the last attempt that ran it; refused ones (a symlink, a FIFO,
    over :data:`~torchstep.untrusted.MAX_OUTPUTS_BYTES`, nested too deep, not an object)
    leave a warning in ``notes``, never a silent loss."""
    for attempt in reversed(attempts):
        for w in attempt.workers.values():
            if w.global_rank == 0:
                data = _read_json(w.paths.outputs, MAX_OUTPUTS_BYTES, "rank 0's outputs file", notes)
                if data is not None and not isinstance(data, dict):
                    notes.append(f"rank 0's outputs file {w.paths.outputs}: refused: not a JSON object")
                return data if isinstance(data, dict) else {}
    return {}


def running_result(settings: AgentSettings, *, started_at: float) -> StepResult:
    """The result written at start (state RUNNING): a launcher sees the agent is up, and
    the reaper turns it into FAILED if the agent is killed before writing the final one.

    Example: ``running_result(settings, started_at=time.time()).state`` is ``"RUNNING"``.
    """
    replica = ReplicaResult(
        role=settings.role,
        replica_id=settings.replica_id or 0,
        state=RUNNING,
        log_dir=settings.log_dir,
        result_file=settings.result_files[0] if settings.result_files else None,
    )
    return StepResult(
        app_id=settings.app_id, state=RUNNING, started_at=started_at, replicas=[replica], log_dir=settings.log_dir
    )


def build_result(
    settings: AgentSettings | None,
    agent: TorchstepAgent | None,
    outcome: Outcome,
    *,
    started_at: float,
    ended_at: float | None = None,
    app_id: str = "unknown",
    warnings: list[str] | None = None,
) -> StepResult:
    """The final step result of this agent (one replica: itself). ``warnings``: what went
    wrong beside the outcome (a log truncated by a full disk...), see ``StepResult.warnings``.

    Example::

        result = build_result(settings, agent, Outcome("workers", succeeded=True), started_at=t0)
        result.exit_code   # 0
    """
    ended = ended_at if ended_at is not None else time.time()
    role = settings.role if settings else "default"
    attempts = agent.attempts if agent is not None else []
    group_rank = agent.group_rank if agent is not None else None
    replica_id = settings.replica_id if settings and settings.replica_id is not None else (group_rank or 0)
    last = attempts[-1] if attempts else None
    notes = list(warnings or [])
    ranks = (
        [rank_result(last, w, role=role, replica_id=replica_id, notes=notes) for w in last.workers.values()]
        if last
        else []
    )
    root = earliest_failure(ranks)
    history = []
    for attempt in attempts[:-1]:
        if attempt.state == FAILED:
            prev = [rank_result(attempt, w, role=role, replica_id=replica_id) for w in attempt.workers.values()]
            first = earliest_failure(prev)
            if first is not None:
                history.append(f"attempt {attempt.index}: {_summary(first)}; restarted")
    non_retryable = bool(last and last.non_retryable)
    message: str | None
    if outcome.kind == "cancelled":
        state, code = CANCELLED, 128 + (outcome.signal or signal.SIGTERM)
        message = outcome.message or f"cancelled by {signal.Signals(outcome.signal or 15).name}"
    elif outcome.kind == "workers" and outcome.succeeded:
        state, code, message = SUCCEEDED, 0, outcome.message
        root = None
    elif outcome.kind == "workers":
        state = FAILED
        if non_retryable:
            code = NON_RETRYABLE_EXIT_CODE
        else:
            code = exit_code_for(exit_code=root.exit_code) if root is not None else AGENT_ERROR_EXIT_CODE
        message = outcome.message or (_summary(root) if root is not None else "the worker group failed")
    elif outcome.kind == "usage":
        state, code, message, non_retryable = FAILED, USAGE_EXIT_CODE, outcome.message, True
    else:
        state, code, message = FAILED, AGENT_ERROR_EXIT_CODE, outcome.message
    if last is not None and last.stacks_summary and state != SUCCEEDED:
        # where the ranks were, unless the root cause's own message says it already
        where = f"where the ranks were: {last.stacks_summary}"
        if message is None:
            message = where
        elif last.stacks_summary not in message:
            message = f"{message}; {where}"
    restarts = agent.failure_restarts if agent is not None else 0
    if agent is not None and agent.membership_restarts:
        history.append(f"{agent.membership_restarts} membership change(s) restarted the group (not counted)")
    replica = ReplicaResult(
        role=role,
        replica_id=replica_id,
        state=state,
        exit_code=code,
        restarts=restarts,
        ranks=ranks,
        log_dir=settings.log_dir if settings else None,
        result_file=settings.result_files[0] if settings and settings.result_files else None,
        message="; ".join([*history, *([message] if message else [])]) or None,
        stacks_file=last.stacks_file if last is not None else None,
        nccl_dumps=[p for a in attempts for p in nccl_dumps(a.log_dir)],
    )
    return StepResult(
        app_id=settings.app_id if settings else app_id,
        state=state,
        exit_code=code,
        retryable=is_retryable(state, non_retryable=non_retryable),
        restarts=restarts,
        duration_s=max(0.0, ended - started_at),
        started_at=started_at,
        ended_at=ended,
        root_cause=root,
        replicas=[replica],
        outputs=_outputs(attempts, notes),
        message=message,
        log_dir=settings.log_dir if settings else None,
        warnings=notes,
        progress=_progress(agent),
    )


def _progress(agent: TorchstepAgent | None) -> dict[str, Any] | None:
    try:
        return agent.progress_now() if agent is not None else None
    except Exception:  # advisory: never cost the result
        return None


def result_paths(settings: AgentSettings) -> list[str]:
    """Where the agent writes its result: ``--result-file``, ``TORCHSTEP_RESULT_FILE`` and
    ``<log-dir>/result.json``, each once (a launcher's result file is often the last one).

    Example: ``result_paths(resolve(["t.py"], environ={"TORCHSTEP_LOG_DIR": "/l",
    "TORCHSTEP_RESULT_FILE": "/l/result.json"}))`` is ``["/l/result.json"]``.
    """
    paths: list[str] = []
    for path in [*settings.result_files, os.path.join(settings.log_dir, "result.json")]:
        if os.path.abspath(path) not in paths:
            paths.append(os.path.abspath(path))
    return paths


def write_all(result: StepResult, paths: list[str]) -> dict[str, str]:
    """Write ``result`` to every path (atomically), and its summary to the termination log
    (``TORCHSTEP_TERMINATION_LOG``) once it is final; returns each path that could not be
    written with the reason (``{"/out/result.json": "No space left on device"}``).

    When a path fails, the result gets a warning ``result not written: <path>: <reason>``
    and the paths that worked are written again with it, so every copy that exists says
    which one is missing.

    Example: ``write_all(result, ["/out/result.json", "/logs/result.json"])`` is ``{}``.
    """
    failed = _write_each(result, paths)
    if failed:
        for path, why in failed.items():
            note = f"result not written: {path}: {why}"
            if note not in result.warnings:
                result.warnings.append(note)
        failed.update(_write_each(result, [p for p in paths if p not in failed]))
    return failed


def _write_each(result: StepResult, paths: list[str]) -> dict[str, str]:
    failed: dict[str, str] = {}
    for path in paths:
        try:
            parent = os.path.dirname(path) or "."
            if not os.path.isdir(parent):
                private_dir(parent)
            result.write(path)
        except OSError as e:
            failed[path] = e.strerror or str(e)
    termination_log = os.environ.get(ENV_TERMINATION_LOG)
    if termination_log and result.state in TERMINAL_STATES:
        # Kubernetes shows this file as the container's termination message: Job watchers
        # (and the local supervisor, when the result file could not be written) read each
        # replica's final result (outputs included) from it.
        try:
            with open(termination_log, "w") as f:
                f.write(result.summary())
        except OSError as e:
            failed[termination_log] = e.strerror or str(e)
    return failed
