"""The one rule per question in ``torchstep.result`` (issue 23): which line names a root
cause, what state a replica ended in, whether a result is retryable — and that the compact
summary (termination message, the local supervisor's fallback) carries them."""

from __future__ import annotations

from torchstep.result import (
    RankResult,
    ReplicaResult,
    StepResult,
    is_retryable,
    last_meaningful_line,
    merge,
    replica_state,
    root_cause_line,
)


def rank(**kw: object) -> RankResult:
    fields: dict = {"role": "trainer", "rank": 3, "local_rank": 1, "state": "FAILED", "exit_code": 1, "replica_id": 0}
    fields.update(kw)
    return RankResult(**fields)


def test_the_root_cause_line_is_the_ranks_last_meaningful_line() -> None:
    chained = [
        "Traceback (most recent call last):",
        '  File "a.py", line 1',
        "KeyError: 'x'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "a.py", line 3',
        "    raise RuntimeError('bad lr')",
        "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
        "RuntimeError: bad lr",
        "W1125 11:53:21.620000 77 torch/x.py:1] bye",
    ]
    assert last_meaningful_line(chained) == "RuntimeError: bad lr"
    assert last_meaningful_line(["a", "last words  ", "", "  "]) == "last words"
    assert last_meaningful_line([]) is None
    # the tail when the agent knows nothing better
    assert (
        root_cause_line(rank(message="exited with code 1", reason="worker_failed", tail=chained))
        == "RuntimeError: bad lr"
    )
    # the exception the worker recorded (error file): its message
    assert (
        root_cause_line(rank(message="ValueError: boom", traceback="Traceback ...", tail=["x"])) == "ValueError: boom"
    )
    # what the agent or launcher observed
    for reason in ("timer_expired", "heartbeat_timeout", "signal", "replica_lost", "stopped"):
        assert root_cause_line(rank(message="seen by the agent", reason=reason, tail=chained)) == "seen by the agent"
    assert root_cause_line(rank(exit_code=-9, signal="SIGKILL")) == "killed by SIGKILL"


def test_one_rule_decides_a_replicas_state() -> None:
    assert replica_state(2, reported="FAILED", stopped=True) == "FAILED"  # failed on its own before the stop
    assert replica_state(143, reported="CANCELLED", stopped=True) == "CANCELLED"
    assert replica_state(143, stopped=True) == replica_state(-15, stopped=True) == "CANCELLED"
    assert replica_state(2, stopped=True) == replica_state(2) == "FAILED"
    assert replica_state(0, reported="RUNNING") == "SUCCEEDED"  # a result that never became final says nothing


def test_a_succeeded_result_is_never_retryable() -> None:
    assert StepResult("a-1", "SUCCEEDED", 0).retryable is False
    assert StepResult.from_dict({**StepResult("a-1", "SUCCEEDED", 0).to_dict(), "retryable": True}).retryable is False
    assert StepResult("a-1", "FAILED", 3).retryable is True and not is_retryable("FAILED", non_retryable=True)
    ok = StepResult("a-1", "SUCCEEDED", 0, replicas=[ReplicaResult("w", 0, "SUCCEEDED", 0)])
    bad = StepResult("a-1", "FAILED", 3, replicas=[ReplicaResult("w", 1, "FAILED", 3)])
    assert merge("a-1", [ok, ok]).retryable is False
    assert merge("a-1", [ok, bad]).retryable is True  # a succeeded replica does not make a failure final
    assert merge("a-1", [ok, StepResult("a-1", "FAILED", 82, retryable=False)]).retryable is False


def test_the_summary_carries_the_root_cause_line_its_log_and_the_warnings() -> None:
    root = rank(
        message="exited with code 2",
        reason="worker_failed",
        log_file="/l/attempt_0/rank3.log",
        tail=["python: can't open file '/w/missing.py': [Errno 2] No such file or directory"],
    )
    warnings = ["log truncated: /l/attempt_0/rank3.log: No space left on device"]
    back = StepResult.from_summary(StepResult("a-1", "FAILED", 2, root_cause=root, warnings=warnings).summary())
    assert back is not None and back.root_cause is not None
    assert (
        root_cause_line(back.root_cause)
        == "python: can't open file '/w/missing.py': [Errno 2] No such file or directory"
    )
    assert back.root_cause.log_file == "/l/attempt_0/rank3.log" and back.warnings == warnings
