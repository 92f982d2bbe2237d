"""The versioned step result (``"schema": 1``) shared by the agent, the local supervisor and
every adapter.

One agent writes a :class:`StepResult` with one :class:`ReplicaResult` (itself); the local
supervisor and the Kubernetes paths aggregate several with :func:`merge`. Adapters surface
``result.to_dict()`` natively (Airflow XCom, Prefect task result, KFP output).

Example::

    >>> from torchstep.result import StepResult, ReplicaResult, RankResult
    >>> r = StepResult(app_id="demo-1a2b", state="SUCCEEDED", exit_code=0, replicas=[
    ...     ReplicaResult(role="trainer", replica_id=0, state="SUCCEEDED", exit_code=0,
    ...                   ranks=[RankResult(role="trainer", rank=0, local_rank=0, state="SUCCEEDED", exit_code=0)])])
    >>> StepResult.from_dict(r.to_dict()) == r
    True
    >>> [x.rank for x in r.ranks]
    [0]
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import errno
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from torchstep.files import private_dir, write_private
from torchstep.untrusted import (
    MAX_JSON_DEPTH,
    MAX_MESSAGE_CHARS,
    MAX_RESULT_BYTES,
    MAX_RESULT_READ_BYTES,
    MAX_SUMMARY_READ_BYTES,
    MAX_TAIL_LINE_BYTES,
    cut,
    escape_controls,
    json_safe,
    parse_json,
    read_capped,
)

SCHEMA_VERSION = 1


class StepState(str, enum.Enum):  # enum.StrEnum's behaviour; Python 3.10 has no StrEnum
    """The one set of state names of a step, a replica, a rank or an agent attempt: the
    agent, the local supervisor, the Kubernetes paths and every adapter use these members.

    A member *is* its name as a string (``StepState.FAILED == "FAILED"``, ``str()``,
    f-strings and ``json.dumps`` give ``"FAILED"``), so the result file (``"schema": 1``)
    and code that compares plain strings are unchanged. The names are TorchX ``AppState``
    names where TorchX has one.

    Example::

        >>> StepState.FAILED == "FAILED", f"{StepState.CANCELLED}", json.dumps([StepState.SUCCEEDED])
        (True, 'CANCELLED', '["SUCCEEDED"]')
        >>> StepState("RUNNING") is StepState.RUNNING
        True
    """

    #: The step ran to the end and every replica succeeded.
    SUCCEEDED = "SUCCEEDED"
    #: A rank, a replica or the run failed (see ``retryable`` for whether to run it again).
    FAILED = "FAILED"
    #: Stopped on purpose (a cancel, a signal): never retried (:func:`is_retryable`).
    CANCELLED = "CANCELLED"
    #: Started and not finished (a result written at start, a live status).
    RUNNING = "RUNNING"
    #: Not started yet; for the Airflow durable path: nothing of the run exists.
    PENDING = "PENDING"
    #: No final state is known (a rank that never reported).
    UNKNOWN = "UNKNOWN"
    #: An agent attempt whose worker group the agent stopped itself (a restart or a
    #: membership change); never the final state of a step.
    STOPPED = "STOPPED"
    #: The Airflow durable path: a try watched the run to its end and reported it, so a
    #: later try starts a fresh one.
    REPORTED = "REPORTED"
    #: Kubernetes took the step's pods away more often than its preemption budget allows
    #: (``DisruptionTarget``: drain, preemption, a Kueue eviction; the kubernetes run option
    #: ``preemption_retries``). Not the step's failure and never retried from the step's
    #: retry budget; TorchX sees ``FAILED`` with the reason (:data:`TORCHX_STATES`).
    PREEMPTED = "PREEMPTED"

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, format_spec: str) -> str:
        return str(self.value).__format__(format_spec)


# The names this module had before :class:`StepState` (``from torchstep.result import FAILED``).
SUCCEEDED = StepState.SUCCEEDED
FAILED = StepState.FAILED
CANCELLED = StepState.CANCELLED
RUNNING = StepState.RUNNING
PENDING = StepState.PENDING
UNKNOWN = StepState.UNKNOWN
PREEMPTED = StepState.PREEMPTED

#: Step states that TorchX's ``AppState`` has no member for → the ``AppState`` name shown
#: instead (the result's message gives the reason).
TORCHX_STATES: dict[str, str] = {PREEMPTED: "FAILED"}

#: The number of trailing log lines of a failed rank kept in the result.
TAIL_LINES = 50

#: Where Kubernetes reads a container's termination message; the agent writes
#: :meth:`StepResult.summary` there when ``TORCHSTEP_TERMINATION_LOG`` names it, so an
#: adapter watching Jobs reads each replica's result (rank-0 outputs included) from the
#: pod status, without access to the pod's files.
TERMINATION_LOG = "/dev/termination-log"
SUMMARY_KEY = "torchstep_result"
SUMMARY_MAX_BYTES = 4096  # Kubernetes keeps at most 4096 bytes of a termination message
TERMINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)


@dataclass
class RankResult:
    """One worker process (a torch.distributed rank) of one replica.

    Args:
        role: the role's name.
        rank: the global rank (torch's ``RANK``).
        local_rank: the rank inside its replica (torch's ``LOCAL_RANK``).
        state: a :class:`StepState` name.
        exit_code: the worker's exit code; ``None``: not known (still running, or lost).
        signal: the signal it died of (``"SIGKILL"``); ``None``: it exited on its own.
        message: the error message from the worker's error file, or what the agent saw.
        traceback: the worker's recorded traceback, when it wrote one.
        timestamp: unix time of the failure, when known (the root cause is the earliest).
        reason: why it ended: ``worker_failed``, ``timer_expired``, ``heartbeat_timeout``...
        replica_id: the replica it ran in; ``None``: not known.
        log_file: the path of its log file, where there is one.
        tail: the last lines of its log when it failed.
        stack: where it was when the agent stopped the group (a timeout, a cancel, a timer,
            the watchdog, ``--hang-timeout``): its main thread's innermost Python frames,
            innermost first (``"/src/train.py:42 in load_batch"``), or one line saying why
            there is none; empty when the agent did not ask (the workers ended on their own).
        waiting_in: the ``torch.distributed`` call it was in then (``"all_reduce"``), if any.
        where: the innermost frame of the user's code then (``"train.py:42 in load_batch"``),
            or why it gave no stack; ``None`` when the agent did not ask.
    """

    role: str
    rank: int  # global rank (torch RANK)
    local_rank: int
    state: str = UNKNOWN
    exit_code: int | None = None
    signal: str | None = None  # e.g. "SIGKILL" when the worker died of a signal
    message: str | None = None  # error message from the worker's error file
    traceback: str | None = None
    timestamp: float | None = None  # unix time of the failure, when known
    reason: str | None = None  # worker_failed | timer_expired | heartbeat_timeout | ...
    replica_id: int | None = None
    log_file: str | None = None
    tail: list[str] = field(default_factory=list)  # last TAIL_LINES lines when it failed
    stack: list[str] = field(default_factory=list)  # innermost frames when the agent stopped it
    waiting_in: str | None = None  # the torch.distributed call it was in then
    where: str | None = None  # its innermost frame of the user's code then, or why no stack


@dataclass
class ReplicaResult:
    """One agent (one "node") of one role.

    Args:
        role: the role's name.
        replica_id: the replica's index in the role (0-based).
        state: a :class:`StepState` name.
        exit_code: the agent's exit code; ``None``: not known.
        restarts: how many times the agent restarted its workers.
        ranks: its worker processes' results.
        log_dir: the directory of its logs, where there is one.
        result_file: the path of the result file it wrote.
        message: an agent-level message (rendezvous timeout, signal...).
        stacks_file: the file with every rank's full stacks (all threads), when the agent
            collected them before stopping the group.
        nccl_dumps: NCCL flight recorder dumps the ranks wrote (``TORCH_NCCL_DUMP_ON_TIMEOUT``).
    """

    role: str
    replica_id: int
    state: str = UNKNOWN
    exit_code: int | None = None
    restarts: int = 0
    ranks: list[RankResult] = field(default_factory=list)
    log_dir: str | None = None
    result_file: str | None = None
    message: str | None = None  # agent-level message (rendezvous timeout, signal, ...)
    stacks_file: str | None = None
    nccl_dumps: list[str] = field(default_factory=list)


@dataclass
class StepResult:
    """The result of a whole step (one agent, or every replica of every role).

    ``state`` is a :class:`StepState` name; ``root_cause`` is the earliest failure (by
    timestamp) or ``None``; ``retryable`` follows :func:`is_retryable`: never for a SUCCEEDED
    or CANCELLED step, ``False`` when any failure was a :class:`torchstep.NonRetryableError`
    (or the reserved exit code).

    Args:
        app_id: the run's id (TorchX's app id, or the step's run name).
        state: a :class:`StepState` name.
        exit_code: the step's exit code (the first failure's); ``None``: not known.
        retryable: ``False`` when a failure said retrying cannot help; recomputed from
            ``state`` by :func:`is_retryable`.
        restarts: worker restarts summed over every replica.
        duration_s: wall-clock seconds from start to end.
        started_at: unix time the step started; ``None``: not known.
        ended_at: unix time the step ended; ``None``: not known.
        root_cause: the earliest failed rank; ``None`` when nothing failed.
        replicas: one result per agent.
        outputs: what the workers recorded with :func:`torchstep.output` (rank 0's).
        message: a one-line summary of what happened.
        log_dir: the directory of the run's logs, where there is one.
        attempts: how many times the step was tried in this run.
        schema: the result file's schema version.
        warnings: problems beside the outcome that did not change it.
        progress: the lowest rank's last :func:`torchstep.progress` report
            (:func:`progress_info`: ``step``, ``total``, ``rate`` per second, ``eta_s``,
            ``rank``, ``time``); ``None`` when no rank reported any.
    """

    app_id: str
    state: str
    exit_code: int | None = None
    retryable: bool = True
    restarts: int = 0
    duration_s: float = 0.0
    started_at: float | None = None
    ended_at: float | None = None
    root_cause: RankResult | None = None
    replicas: list[ReplicaResult] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    log_dir: str | None = None
    attempts: int = 1
    schema: int = SCHEMA_VERSION
    #: What went wrong beside the outcome and did not change it (a log that could not be
    #: written: ``"log truncated: <path>: No space left on device"``).
    warnings: list[str] = field(default_factory=list)
    progress: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.retryable = is_retryable(self.state, non_retryable=not self.retryable)
        self.outputs = _safe_outputs(self.outputs, self.warnings)

    # -- views -------------------------------------------------------------------------
    @property
    def ranks(self) -> list[RankResult]:
        """Every rank of every replica, in role / replica / rank order."""
        return [rk for rep in self.replicas for rk in rep.ranks]

    @property
    def succeeded(self) -> bool:
        """Whether the step's state is SUCCEEDED."""
        return self.state == SUCCEEDED

    def app_status(self) -> Any:
        """This result as a TorchX ``AppStatus`` (roles and replicas included)."""
        from torchx.specs import AppState, AppStatus, ReplicaStatus, RoleStatus

        def state_of(name: str) -> AppState:
            name = TORCHX_STATES.get(name, name)
            return AppState[name] if name in AppState.__members__ else AppState.UNKNOWN

        roles: dict[str, list[ReplicaStatus]] = {}
        for rep in self.replicas:
            roles.setdefault(rep.role, []).append(
                ReplicaStatus(
                    id=rep.replica_id,
                    state=state_of(rep.state),
                    role=rep.role,
                    hostname="localhost",
                    structured_error_msg=json.dumps(dataclasses.asdict(self.root_cause))
                    if self.root_cause is not None
                    and self.root_cause.role == rep.role
                    and self.root_cause.replica_id == rep.replica_id
                    else "<NONE>",
                )
            )
        msg = self.message or ""
        if self.root_cause is not None and not msg:
            msg = root_cause_line(self.root_cause)
        return AppStatus(
            state=state_of(self.state),
            num_restarts=self.restarts,
            msg=msg,
            roles=[RoleStatus(role=name, replicas=reps) for name, reps in roles.items()],
        )

    # -- (de)serialisation ---------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """This result as JSON data (the result file's ``"schema": 1``), states as plain
        strings, that every JSON encoder accepts: a non-finite number is the string
        ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``; and that fits
        :data:`~torchstep.untrusted.MAX_RESULT_BYTES`: beyond it the ranks' tails are cut,
        then the outputs dropped, each with a warning in ``warnings``."""
        notes: list[str] = []
        outputs = _safe_outputs(self.outputs, notes)
        shallow = copy.copy(self)  # outputs go in checked: dataclasses.asdict recurses into them
        shallow.outputs = {}
        data = dataclasses.asdict(shallow, dict_factory=_plain_states)
        data["outputs"] = outputs
        safe, more = json_safe(data, what="result", max_depth=MAX_JSON_DEPTH + 8)
        if safe is not None:
            data = safe
        data["warnings"] = [*data.get("warnings", []), *(n for n in notes + more if n not in data["warnings"])]
        return _fit(data, MAX_RESULT_BYTES)

    def to_json(self, indent: int | None = 2) -> str:
        """This result as JSON text (:meth:`to_dict`).

        Args:
            indent: spaces per nesting level; ``None``: one line.

        Returns:
            The JSON text.
        """
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, default=str, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        """The result in JSON data written by :meth:`to_dict` (a result file).

        Args:
            data: the decoded JSON object; unknown keys are ignored.

        Returns:
            The result, ranks and replicas included.

        Raises:
            ValueError: ``data["schema"]`` is not the schema this version reads.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a step result is a JSON object, not {type(data).__name__}")
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"unsupported step result schema {data.get('schema')!r} (expected {SCHEMA_VERSION})")
        d = dict(data)
        rc = d.pop("root_cause", None)
        reps = d.pop("replicas", [])
        notes: list[str] = []
        fields = _declared(cls, d, "result", notes)
        if "app_id" not in fields or "state" not in fields:
            raise ValueError("a step result needs a string app_id and state: " + "; ".join(notes or ["missing"]))
        if not isinstance(reps, list):
            notes.append(f"result.replicas: refused {type(reps).__name__}; expected a list")
            reps = []
        replicas = [r for i, x in enumerate(reps) if (r := _replica_from(x, f"result.replicas[{i}]", notes))]
        out = cls(**fields, root_cause=_rank_from(rc, "result.root_cause", notes) if rc else None, replicas=replicas)
        out.warnings.extend(n for n in notes if n not in out.warnings)
        return out

    def summary(self, max_bytes: int = SUMMARY_MAX_BYTES) -> str:
        """A compact JSON of this result that fits ``max_bytes`` (a termination message):
        state, exit code, retryable, restarts, the root cause without its traceback, and the
        outputs — dropped (``"outputs_truncated": true``) only when they do not fit.

        Args:
            max_bytes: the most bytes the text may take (Kubernetes keeps 4096 of a
                termination message).

        Returns:
            The JSON text; :meth:`from_summary` reads it back.

        >>> r = StepResult(app_id="a-1", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.1})
        >>> StepResult.from_summary(r.summary()).outputs
        {'loss': 0.1}
        """

        def text(data: dict[str, Any]) -> str:
            return json.dumps(data, separators=(",", ":"), default=str)

        def cut(msg: str | None, n: int) -> str | None:
            return msg if msg is None or len(msg) <= n else msg[: n - 1] + "…"

        rc = self.root_cause
        data: dict[str, Any] = {
            SUMMARY_KEY: SCHEMA_VERSION,
            "app_id": self.app_id,
            "state": self.state,
            "exit_code": self.exit_code,
            "retryable": self.retryable,
            "restarts": self.restarts,
            "duration_s": round(self.duration_s, 3),
            "message": cut(self.message, 600),
            "root_cause": None
            if rc is None
            else {
                "role": rc.role,
                "rank": rc.rank,
                "local_rank": rc.local_rank,
                "replica_id": rc.replica_id,
                "state": rc.state,
                "exit_code": rc.exit_code,
                "signal": rc.signal,
                "reason": rc.reason,
                "timestamp": rc.timestamp,
                "message": cut(rc.message, 600),
                "line": cut(root_cause_line(rc), 600),
                "log_file": rc.log_file,
            },
            "outputs": self.outputs,
            "warnings": [cut(w, 600) for w in self.warnings[:10]],
        }
        if len(text(data).encode()) > max_bytes:
            data["outputs"], data["outputs_truncated"] = {}, True
        for n in (200, 40):
            if len(text(data).encode()) <= max_bytes:
                break
            data["message"] = cut(self.message, n)
            data["warnings"] = [cut(w, n) for w in self.warnings[:3]]
            if data["root_cause"] is not None:
                data["root_cause"]["message"] = cut(rc.message if rc else None, n)
                data["root_cause"]["line"] = cut(root_cause_line(rc), n) if rc else None
        return text(data)

    @classmethod
    def from_summary(cls, text: str | None) -> StepResult | None:
        """The result in a :meth:`summary` text, or ``None`` when ``text`` is not one
        (e.g. a termination message that fell back to the container's last log lines).

        Args:
            text: a termination message or any text; ``None`` reads as not a summary.

        Returns:
            The result (without replicas, the root cause's tail its meaningful line), or ``None``.
        """
        return cls.read_summary(text)[0]

    @classmethod
    def read_summary(cls, text: str | None) -> tuple[StepResult | None, list[str]]:
        """:meth:`from_summary` for a text a pod or an agent's worker could have written
        (a termination message): nothing in it raises; a field of the wrong type is left
        out and named in the result's ``warnings``.

        Args:
            text: a termination message or any text.

        Returns:
            ``(result, [])``, or ``(None, warnings)``: ``warnings`` is empty when ``text``
            is simply not a summary (the container's last log lines), else says why a
            summary was refused (too large, nested too deep).

        >>> StepResult.read_summary('{"torchstep_result": 1, "state": "FAILED", "restarts": "x"}')[0].warnings
        ["result summary.restarts: refused str 'x'; expected int"]
        """
        if not isinstance(text, str) or not text.lstrip().startswith("{"):
            return None, []  # the container's last log lines, not a summary
        if len(text) > MAX_SUMMARY_READ_BYTES:
            return None, [f"result summary: refused: {len(text)} characters, over the cap of {MAX_SUMMARY_READ_BYTES}"]
        data, notes = parse_json(text, what="result summary")
        if not isinstance(data, dict) or data.get(SUMMARY_KEY) != SCHEMA_VERSION:
            return None, notes if SUMMARY_KEY in text[:200] else []
        fields = _declared(
            cls,
            {**data, "app_id": data.get("app_id", ""), "state": data.get("state", UNKNOWN)},
            "result summary",
            notes,
        )
        fields.setdefault("app_id", "")
        fields.setdefault("state", UNKNOWN)
        for name in ("replicas", "started_at", "ended_at", "log_dir", "attempts", "schema"):
            fields.pop(name, None)  # not in a summary
        rc = data.get("root_cause")
        root = None
        if rc is not None:
            root = _rank_from(rc, "result summary.root_cause", notes)
            line = rc.get("line") if isinstance(rc, dict) else None
            if root is not None and isinstance(line, str) and line:
                root.tail = [line]  # the root cause's meaningful line stands in for its tail
        out = cls(**fields, root_cause=root)
        out.warnings.extend(n for n in notes if n not in out.warnings)
        return out, []

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> StepResult:
        """Read a result file written by :meth:`write`.

        Args:
            path: the result file.

        Returns:
            The result.

        The file is read as one a worker could have planted: never through a symlink,
        never blocking (a FIFO), a regular file of at most
        :data:`~torchstep.untrusted.MAX_RESULT_READ_BYTES`, JSON nested at most
        :data:`~torchstep.untrusted.MAX_JSON_DEPTH` levels; fields of the wrong type are
        dropped with a warning in ``warnings``.

        Raises:
            FileNotFoundError: there is no such file.
            ValueError: it was refused (a symlink, not a regular file, too large, not
                JSON, too deep) or is not a result of this schema; the message says which.
        """
        p = os.fspath(path)
        data, why = read_capped(p, MAX_RESULT_READ_BYTES, what="result file")
        if why is not None:
            raise ValueError(why)
        if data is None:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", p)
        value, notes = parse_json(data, what=f"result file {p}")
        if value is None:
            raise ValueError(notes[0])
        try:
            result = cls.from_dict(value)
        except ValueError as e:
            raise ValueError(f"result file {p}: {e}") from None
        result.warnings.extend(n for n in notes if n not in result.warnings)
        return result

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write atomically (temp file in the same directory + rename).

        Args:
            path: the result file; missing parent directories are created.

        Raises:
            torchstep.files.UnsafePathError: ``path`` is a symlink.
        """
        write_json_atomic(path, self.to_dict())


def _plain_states(items: list[tuple[str, Any]]) -> dict[str, Any]:
    # a StepState is a str already; plain str keeps pickles and stores free of the Enum class
    return {k: str(v) if isinstance(v, StepState) else v for k, v in items}


def _rank_from(d: Any, where: str = "rank", notes: list[str] | None = None) -> RankResult | None:
    """The rank in ``d``, or ``None`` (with a note) when it is not one."""
    notes = [] if notes is None else notes
    if not isinstance(d, dict):
        notes.append(f"{where}: refused {type(d).__name__}; expected an object")
        return None
    fields = _declared(RankResult, d, where, notes)
    if not all(k in fields for k in ("role", "rank", "local_rank")):
        notes.append(f"{where}: refused: a rank needs role, rank and local_rank")
        return None
    return RankResult(**fields)


def _replica_from(d: Any, where: str = "replica", notes: list[str] | None = None) -> ReplicaResult | None:
    notes = [] if notes is None else notes
    if not isinstance(d, dict):
        notes.append(f"{where}: refused {type(d).__name__}; expected an object")
        return None
    fields = _declared(ReplicaResult, d, where, notes)
    fields.pop("ranks", None)
    if not all(k in fields for k in ("role", "replica_id")):
        notes.append(f"{where}: refused: a replica needs role and replica_id")
        return None
    raw = d.get("ranks", [])
    ranks = raw if isinstance(raw, list) else []
    kept = [r for i, x in enumerate(ranks) if (r := _rank_from(x, f"{where}.ranks[{i}]", notes))]
    return ReplicaResult(**fields, ranks=kept)


_NESTED = ("root_cause", "replicas", "ranks")


def _declared(cls: Any, d: dict[str, Any], where: str = "result", notes: list[str] | None = None) -> dict[str, Any]:
    """The fields of ``cls`` in ``d`` that have the declared type, each number as the
    schema declares it: a result that went through a store of doubles (a KFP STRUCT
    parameter: ``"exit_code": 0.0``) or a JSON encoder that drops ``.0``
    (``"duration_s": 3``) reads back with its ints and floats. A field of another type
    (``"restarts": "x"``, ``"outputs": [1, 2]``, a number too large) is left out, with a
    note naming it in ``notes``; strings from a worker are cut to a bounded length."""
    notes = [] if notes is None else notes
    out = {}
    for f in dataclasses.fields(cls):
        if f.name not in d or f.name in _NESTED:
            continue
        ok, value = _typed(d[f.name], str(f.type))
        if ok:
            out[f.name] = value
        else:
            shown = cut(repr(d[f.name]), 40)
            notes.append(f"{where}.{f.name}: refused {type(d[f.name]).__name__} {shown}; expected {f.type}")
    return out


def _typed(value: Any, declared: str) -> tuple[bool, Any]:
    """Whether ``value`` fits the declared annotation (as text: ``"int | None"``), and the
    value converted to it."""
    if value is None:
        return "None" in declared, None
    kinds = {k.strip() for k in declared.split("|")}
    if "bool" in kinds:
        return isinstance(value, bool), value
    if isinstance(value, bool):
        return False, value
    if "float" in kinds:
        if not isinstance(value, int | float):
            return False, value
        try:
            f = float(value)
        except OverflowError:  # an int of hundreds of digits
            return False, value
        return f == f and abs(f) != float("inf"), f
    if "int" in kinds:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return isinstance(value, int) and -(2**63) <= value < 2**63, value  # an exit code, a count, a rank
    if "str" in kinds:
        if not isinstance(value, str):
            return False, value
        return True, cut(value, MAX_MESSAGE_CHARS * 16)
    if declared.startswith("list[str]"):
        return isinstance(value, list) and all(isinstance(x, str) for x in value), value
    if declared.startswith("dict["):
        return isinstance(value, dict), value
    return True, value


def _safe_outputs(outputs: Any, notes: list[str]) -> dict[str, Any]:
    """``outputs`` as :func:`~torchstep.untrusted.json_safe` data (non-finite numbers as
    strings), or ``{}`` when they are not an object or are nested too deep; ``notes`` gets
    a warning for each change."""
    if not isinstance(outputs, dict):
        note = f"outputs: refused {type(outputs).__name__}; expected an object of name: value"
        if note not in notes:
            notes.append(note)
        return {}
    safe, more = json_safe(outputs, what="outputs")
    notes.extend(n for n in more if n not in notes)
    return safe if isinstance(safe, dict) else {}


#: Lines of each rank's tail kept when a result is over its cap.
_FIT_TAIL = 5


def _fit(data: dict[str, Any], max_bytes: int) -> dict[str, Any]:
    """``data`` (a result's JSON) cut to fit ``max_bytes``: first every rank's tail to its
    last lines and tracebacks to their end, then the outputs, then tails and tracebacks
    altogether; each step leaves a warning."""

    def size() -> int:
        return len(json.dumps(data, separators=(",", ":"), default=str).encode())

    if size() <= max_bytes:
        return data
    ranks = [rk for rep in data.get("replicas") or [] for rk in rep.get("ranks") or []]
    if isinstance(data.get("root_cause"), dict):
        ranks.append(data["root_cause"])
    for rk in ranks:
        rk["tail"] = (rk.get("tail") or [])[-_FIT_TAIL:]
        if isinstance(rk.get("traceback"), str):
            rk["traceback"] = _cut_head(rk["traceback"], MAX_MESSAGE_CHARS)
    data["warnings"].append(f"result over {max_bytes} bytes: each rank's tail cut to its last {_FIT_TAIL} lines")
    if size() > max_bytes and data.get("outputs"):
        data["outputs"] = {}
        data["warnings"].append(f"result over {max_bytes} bytes: the outputs were dropped")
    if size() > max_bytes:
        for rk in ranks:
            rk["tail"], rk["traceback"] = [], None
            rk["message"] = cut(rk.get("message"), 200)
        data["warnings"].append(f"result over {max_bytes} bytes: the ranks' tails and tracebacks were dropped")
    return data


def _cut_head(text: str, max_chars: int) -> str:
    """The end of ``text`` (a traceback's last frames and its exception), at most
    ``max_chars`` characters and a marker."""
    if len(text) <= max_chars:
        return text
    return f"[{len(text) - max_chars} characters cut] …{text[-max_chars:]}"


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """Write JSON so a reader never sees a half-written file, even if we are killed.

    Args:
        path: the file to write (``0600``, as :func:`write_text_atomic`).
        data: JSON-serialisable data; other values are written as their ``str``.

    Raises:
        torchstep.files.UnsafePathError: ``path`` is a symlink.
    """
    write_text_atomic(path, json.dumps(data, indent=2, default=str))


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to a temp file beside ``path``, fsync it, then rename it into place.
    The file is ``0600``; missing parent directories are created ``0700``; a symlink at
    ``path`` is refused, never followed.

    Args:
        path: the file to write.
        text: its whole content.

    Raises:
        torchstep.files.UnsafePathError: ``path`` is a symlink.
    """
    parent = os.path.dirname(os.path.abspath(os.fspath(path)))
    if not os.path.isdir(parent):
        private_dir(parent)
    write_private(path, text)


def is_retryable(state: str, *, non_retryable: bool = False) -> bool:
    """The one rule for a result's ``retryable``: whether an orchestrator may run the step
    again. Never after SUCCEEDED (nothing to retry), never after CANCELLED (someone stopped
    it on purpose: a cancel, a kill, a timeout's stop), never after a non-retryable failure
    (``NonRetryableError``, exit 82, a usage error); otherwise yes.

    A replica that was CANCELLED does not make its step's failure final
    (:func:`is_final_failure`): an agent cannot tell a preemption from a deliberate stop, so
    the step's own state decides.

    Args:
        state: a :class:`StepState` name.
        non_retryable: whether a failure said retrying cannot help.

    Returns:
        Whether an orchestrator may run the step again.

    >>> is_retryable("SUCCEEDED"), is_retryable("CANCELLED"), is_retryable("FAILED")
    (False, False, True)
    >>> is_retryable("FAILED", non_retryable=True)
    False
    """
    return state not in (SUCCEEDED, CANCELLED) and not non_retryable


def is_final_failure(result: StepResult) -> bool:
    """Whether ``result`` (of one replica, or one part of a run) failed in a way that makes
    the whole step non-retryable: it is not retryable, and not because it succeeded or was
    cancelled (a cancelled replica may have been preempted; the step's state decides).

    Args:
        result: the result of one part of a run.

    Returns:
        Whether the step that ``result`` is part of must not be retried.

    >>> is_final_failure(StepResult("a-1", "FAILED", 82, retryable=False))
    True
    >>> is_final_failure(StepResult("a-1", "CANCELLED", 143)), is_final_failure(StepResult("a-1", "SUCCEEDED", 0))
    (False, False)
    """
    return not result.retryable and result.state not in (SUCCEEDED, CANCELLED)


def replica_state(exit_code: int | None, *, reported: str | None = None, stopped: bool = False) -> str:
    """The one rule for the final state of a replica (one agent process), used by the live
    status lines and by the result alike.

    The state the agent itself wrote in its final result (``reported``: SUCCEEDED, FAILED
    or CANCELLED) wins: it knows whether its workers failed on their own or were stopped.
    Without it: exit 0 is SUCCEEDED; a replica its supervisor ``stopped`` (cancel, timeout, a
    failure elsewhere) that ended by a signal (``-S`` or ``128+S``) is CANCELLED; anything
    else is FAILED.

    Args:
        exit_code: the agent process's exit code (negative: killed by that signal);
            ``None``: not known.
        reported: the state the agent wrote in its final result, if any.
        stopped: whether its supervisor stopped it.

    Returns:
        A :class:`StepState` name.

    >>> [str(replica_state(2, reported="FAILED", stopped=True)), str(replica_state(143, stopped=True))]
    ['FAILED', 'CANCELLED']
    >>> replica_state(0) == SUCCEEDED, replica_state(2, stopped=True) is StepState.FAILED
    (True, True)
    """
    if reported in TERMINAL_STATES:
        return reported
    if exit_code == 0:
        return SUCCEEDED
    if stopped and exit_code is not None and (exit_code < 0 or 128 < exit_code < 128 + 65):
        return CANCELLED
    return FAILED


#: Reasons whose message the agent or supervisor wrote from what it saw (a timer, a lost
#: replica, a signal...): that message says more than the rank's last log line.
_OBSERVED_REASONS = (
    "timer_expired",
    "heartbeat_timeout",
    "hang_timeout",
    "stopped",
    "cancelled",
    "replica_lost",
    "signal",
)
#: torch's own glog-style lines (``W1125 11:53:21.620000 ...``, ``[rank0]:[W1125 ...]``):
#: warnings printed at exit, never the cause.
_NOISE = re.compile(r"^(\[rank\d+\]:)?\[?[IWE]\d{4} \d\d:\d\d:\d\d")


def last_meaningful_line(lines: list[str]) -> str | None:
    """The line of a log tail that says what went wrong: the exception line of its last
    Python traceback, else its last non-empty line (torch's own warning lines skipped).

    Args:
        lines: the log's last lines, oldest first.

    Returns:
        The line, stripped; ``None`` when every line is empty or torch's noise.

    >>> last_meaningful_line(["Traceback (most recent call last):", '  File "t.py", line 1, in <module>',
    ...                       "ValueError: bad lr", "[W1125 11:53:21.62 ProcessGroup.cpp] destroy not called"])
    'ValueError: bad lr'
    >>> last_meaningful_line(["starting", "python: can't open file '/x/missing.py': [Errno 2] No such file", ""])
    "python: can't open file '/x/missing.py': [Errno 2] No such file"
    """
    text = [line.rstrip() for line in lines]
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback (most recent call last):")]
    if starts:
        for line in text[starts[-1] + 1 :]:
            if line and not line[0].isspace():  # frames and carets are indented; the exception is not
                return line
    for line in reversed(text):
        if line.strip() and not _NOISE.match(line):
            return line.strip()
    return None


def root_cause_line(rank: RankResult) -> str:
    """The one line that says why ``rank`` failed, on every surface (``torchstep run``, the
    agent's last line, Airflow, Prefect, KFP): what the agent observed (a timer, a heartbeat,
    a lost replica, a stop), else the exception the worker recorded (error file), else the
    rank's last meaningful log line (:func:`last_meaningful_line` of its ``tail``), else its
    message.

    Args:
        rank: the failed rank.

    Returns:
        One line, never empty (at worst ``"exit code N"``), its control characters made
        visible (:func:`~torchstep.untrusted.escape_controls`: a worker's ``ESC`` never
        reaches a console or an orchestrator's page) and cut to
        :data:`~torchstep.untrusted.MAX_TAIL_LINE_BYTES` characters.

    >>> root_cause_line(RankResult("train", 0, 0, "FAILED", 2, message="exited with code 2",
    ...                            tail=["python: can't open file '/x/missing.py': [Errno 2] No such file"]))
    "python: can't open file '/x/missing.py': [Errno 2] No such file"
    """
    return cut(escape_controls(_root_cause_text(rank), newlines=True), MAX_TAIL_LINE_BYTES) or ""


def _root_cause_text(rank: RankResult) -> str:
    message = (rank.message or "").strip()
    said = message.splitlines()[0] if message else ""
    if said and (rank.reason in _OBSERVED_REASONS or rank.traceback):
        return said  # observed by the agent, or the exception the worker recorded
    line = last_meaningful_line(rank.tail)
    if line:
        return line
    if said:
        return said
    return f"killed by {rank.signal}" if rank.signal else f"exit code {rank.exit_code}"


def _cause_first(r: RankResult) -> tuple[bool, bool, float, int]:
    """Root-cause order: a non-retryable failure first (the peers' failures beside it are
    most often its consequence: a collective broken by its exit, within the same second),
    then the earliest timestamp (unknown times last), then the lowest rank."""
    return (r.reason != "non_retryable", r.timestamp is None, r.timestamp or 0.0, r.rank)


def earliest_failure(ranks: list[RankResult]) -> RankResult | None:
    """The root cause: the failed rank with the earliest timestamp (unknown times last), a
    rank that failed non-retryably before any other.

    Args:
        ranks: every rank of a run.

    Returns:
        The earliest failed rank; ``None`` when none failed.
    """
    failed = [
        r for r in ranks if r.state not in (SUCCEEDED, UNKNOWN, RUNNING, PENDING) or (r.exit_code not in (None, 0))
    ]
    if not failed:
        return None
    return min(failed, key=_cause_first)


#: How an agent's result message starts when torch ended it as a spare node of a closed
#: rendezvous (``RendezvousGracefulExitError``; :mod:`torchstep.agent.runner` writes it).
GRACEFUL_EXIT_MESSAGE = "rendezvous closed"


def _left_as_spare(result: StepResult) -> bool:
    """Whether an agent's result is a graceful exit before any of its workers ran."""
    messages = [result.message or "", *(rep.message or "" for rep in result.replicas)]
    return (
        result.state == SUCCEEDED
        and any(m.startswith(GRACEFUL_EXIT_MESSAGE) for m in messages)
        and not any(rep.ranks for rep in result.replicas)
    )


def merge(
    app_id: str,
    replicas: list[StepResult],
    *,
    started_at: float | None = None,
    ended_at: float | None = None,
    attempts: int = 1,
    log_dir: str | None = None,
    state: str | None = None,
) -> StepResult:
    """Aggregate the per-agent results of one run into one step result: the one merge
    every target and adapter uses (the local supervisor, ``JobGang``, the adapters).

    State: ``state`` when the caller knows it better (a Job's own condition, a cancel),
    else CANCELLED if any replica was cancelled, else FAILED if any failed, else SUCCEEDED
    when all succeeded. Outputs come from the first replica that has any (the replica that
    holds global rank 0 of the first role, in role / replica order). Restarts are summed;
    the root cause is the earliest failure; the message is the first replica's message.

    Args:
        app_id: the run's id, the merged result's ``app_id``.
        replicas: the per-agent (or per-part) results.
        started_at: unix start time; ``None``: the earliest of ``replicas``.
        ended_at: unix end time; ``None``: the latest of ``replicas``.
        attempts: how many times the step was tried.
        log_dir: the run's log directory, where there is one.
        state: the step's state when the caller knows it better; ``None``: from ``replicas``.

    Returns:
        The step result.

    >>> a = StepResult("app-1", SUCCEEDED, 0, outputs={"loss": 0.1})
    >>> b = StepResult("app-1", FAILED, 82, retryable=False, message="worker/1 exited 82")
    >>> m = merge("app-1", [a, b])
    >>> (str(m.state), m.exit_code, m.retryable, m.outputs, m.message)
    ('FAILED', 82, False, {'loss': 0.1}, 'worker/1 exited 82')
    """
    reps = [rep for r in replicas for rep in r.replicas]
    states = [r.state for r in replicas]
    if state is not None:
        pass
    elif CANCELLED in states:
        state = CANCELLED
    elif FAILED in states or UNKNOWN in states:
        state = FAILED
    elif states and all(s == SUCCEEDED for s in states):
        state = SUCCEEDED
    else:
        state = UNKNOWN
    roots = [r.root_cause for r in replicas if r.root_cause is not None]
    root = min(roots, key=_cause_first) if roots else None
    exit_code = 0 if state == SUCCEEDED else next((r.exit_code for r in replicas if r.exit_code not in (None, 0)), None)
    if state == SUCCEEDED and replicas and all(_left_as_spare(r) for r in replicas):
        # a spare's graceful exit is a success only beside peers that trained: alone it is
        # a rendezvous closed under every agent (e.g. by a forged state), no work done
        state, exit_code = FAILED, 1
        first = reps[0] if reps else None
        root = RankResult(
            role=first.role if first else "",
            rank=-1,
            local_rank=-1,
            state=FAILED,
            message=(
                "no replica ran its workers: every agent left a closed rendezvous as a spare"
                f" ({next((r.message for r in replicas if r.message), GRACEFUL_EXIT_MESSAGE)})"
            ),
            reason="rendezvous_closed",
            replica_id=first.replica_id if first else None,
        )
    outputs: dict[str, Any] = {}
    for r in replicas:
        if r.outputs:
            outputs = r.outputs
            break
    t0 = started_at if started_at is not None else min((r.started_at for r in replicas if r.started_at), default=None)
    t1 = ended_at if ended_at is not None else max((r.ended_at for r in replicas if r.ended_at), default=None)
    return StepResult(
        app_id=app_id,
        state=state,
        exit_code=exit_code,
        retryable=is_retryable(state, non_retryable=any(is_final_failure(r) for r in replicas)),
        restarts=sum(r.restarts for r in replicas),
        duration_s=(t1 - t0) if (t0 is not None and t1 is not None) else 0.0,
        started_at=t0,
        ended_at=t1,
        root_cause=root,
        replicas=reps,
        outputs=outputs,
        message=next((r.message for r in replicas if r.message), None),
        log_dir=log_dir,
        attempts=attempts,
        warnings=[w for r in replicas for w in r.warnings],
        progress=min((r.progress for r in replicas if r.progress), key=lambda p: p.get("rank", 0), default=None),
    )


def progress_info(data: Any, *, rank: int = 0) -> dict[str, Any] | None:
    """A worker's progress file (what :func:`torchstep.progress` writes) as the result's
    ``progress``: ``step``, ``total``, ``rate`` (steps per second since its first report),
    ``eta_s`` (seconds left at that rate), ``rank`` and ``time`` (of the report).

    Args:
        data: the decoded progress file (a JSON object); anything else gives ``None``.
        rank: the global rank that wrote it.

    Returns:
        The progress, or ``None`` when ``data`` is not a progress report.

    >>> p = progress_info({"step": 120, "total": 1000, "time": 70.0, "first_step": 0, "first_time": 10.0})
    >>> (p["rate"], p["eta_s"])
    (2.0, 440.0)
    """
    if not isinstance(data, dict):
        return None

    def number(key: str) -> float | None:
        v = data.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and v == v else None

    step, total, when = number("step"), number("total"), number("time")
    if step is None or when is None:
        return None
    first, t0 = number("first_step"), number("first_time")
    rate = None
    if first is not None and t0 is not None and when > t0 and step > first:
        rate = (step - first) / (when - t0)
    eta = (total - step) / rate if rate and total is not None and total >= step else None
    return {
        "step": int(step) if step.is_integer() else step,
        "total": (int(total) if total.is_integer() else total) if total is not None else None,
        "rate": round(rate, 6) if rate is not None else None,
        "eta_s": round(eta, 1) if eta is not None else None,
        "rank": rank,
        "time": when,
    }


def _duration(seconds: float) -> str:
    s = round(seconds)
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def progress_line(progress: StepResult | dict[str, Any] | None) -> str | None:
    """The one line the agent logs and an adapter shows for a step's progress.

    Args:
        progress: a step result (its ``progress``) or a ``progress`` dict
            (:func:`progress_info`).

    Returns:
        ``"progress 120/1000 (12%), ETA 3m40s"`` (no ETA before a rate is known, no
        percentage without a total); ``None`` when there is no progress.

    >>> progress_line({"step": 120, "total": 1000, "rate": 4.0, "eta_s": 220.0})
    'progress 120/1000 (12%), ETA 3m40s'
    >>> progress_line({"step": 7, "total": None, "rate": None, "eta_s": None})
    'progress 7'
    """
    p = progress.progress if isinstance(progress, StepResult) else progress
    if not isinstance(p, dict) or not isinstance(p.get("step"), int | float):
        return None
    step, total = p["step"], p.get("total")
    if not isinstance(total, int | float) or total <= 0:
        return f"progress {step:g}"
    text = f"progress {step:g}/{total:g} ({int(100 * step / total)}%)"
    eta = p.get("eta_s")
    if isinstance(eta, int | float) and step < total:
        text += f", ETA {_duration(eta)}"
    return text


def _rank_spans(ranks: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``."""
    ranks = sorted(ranks)
    parts: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(f"{ranks[i]}-{ranks[j]}" if j > i + 1 else (f"{ranks[i]}, {ranks[j]}" if j > i else f"{ranks[i]}"))
        i = j + 1
    return ("ranks " if len(ranks) > 1 else "rank ") + ", ".join(parts)


def summarize_where(lines: list[tuple[int, str]]) -> str:
    """One line from each rank's place (``"at f.py:1 in g"``, ``"waiting in all_reduce"``,
    ``"gave no stack: ..."``): ranks grouped by place, those outside a collective first.

    Args:
        lines: ``(global rank, place)`` pairs.

    Returns:
        The line (empty when ``lines`` is).

    >>> summarize_where([(0, "waiting in all_reduce"), (1, "waiting in all_reduce"), (2, "at t.py:4 in load")])
    'rank 2 at t.py:4 in load; ranks 0, 1 waiting in all_reduce'
    """
    groups: dict[str, list[int]] = {}
    for rank, place in lines:
        groups.setdefault(place, []).append(rank)

    def order(item: tuple[str, list[int]]) -> tuple[int, int]:
        place, ranks = item
        return (0 if place.startswith("at ") else 1 if place.startswith("waiting") else 2), min(ranks)

    return "; ".join(f"{_rank_spans(ranks)} {place}" for place, ranks in sorted(groups.items(), key=order))


def where_ranks_were(result: StepResult) -> str | None:
    """Where every rank of every replica was when its agent stopped it (the ranks' ``where``
    and ``waiting_in``), as one line: ``rank 3 at train.py:42 in load_batch; ranks 0-2
    waiting in all_reduce``. What a launcher or an adapter adds to a timeout's or a cancel's
    message.

    Args:
        result: a step result (merged or one agent's).

    Returns:
        The line; ``None`` when no agent took stacks.
    """
    lines = []
    for r in result.ranks:
        if r.where is None:
            continue
        if r.waiting_in:
            lines.append((r.rank, f"waiting in {r.waiting_in}"))
        elif r.stack and r.stack[0].startswith("no stack: "):
            lines.append((r.rank, f"gave no stack: {r.where}"))
        else:
            lines.append((r.rank, f"at {r.where}"))
    return summarize_where(lines) or None
