"""``StepResult.summary()``: the compact result the agent writes as a Kubernetes
termination message (4096 bytes at most), and ``from_summary`` reading it back."""

from __future__ import annotations

import json

from torchstep.result import SUMMARY_MAX_BYTES, RankResult, ReplicaResult, StepResult


def failed(outputs: dict, message: str = "disk full") -> StepResult:
    root = RankResult(role="trainer", rank=1, local_rank=1, state="FAILED", exit_code=3, message=message,
                      traceback="Traceback ...\n" * 500, timestamp=12.5, reason="worker_failed", replica_id=0)  # fmt: skip
    return StepResult(app_id="train-1a2b", state="FAILED", exit_code=3, restarts=2, root_cause=root,
                      replicas=[ReplicaResult(role="trainer", replica_id=0, ranks=[root])], outputs=outputs,
                      message=f"rank 1 failed: {message}")  # fmt: skip


def test_round_trip_keeps_what_an_orchestrator_needs() -> None:
    back = StepResult.from_summary(failed({"loss": 0.5}).summary())
    assert back is not None
    assert (back.state, back.exit_code, back.restarts, back.retryable) == ("FAILED", 3, 2, True)
    assert back.outputs == {"loss": 0.5}
    assert back.root_cause is not None
    assert (back.root_cause.rank, back.root_cause.reason, back.root_cause.message) == (1, "worker_failed", "disk full")
    assert back.root_cause.traceback is None  # tracebacks stay in the result file


def test_large_outputs_are_dropped_and_flagged_never_cut_into_invalid_json() -> None:
    text = failed({"blob": "x" * 10_000}).summary()
    assert len(text.encode()) <= SUMMARY_MAX_BYTES
    data = json.loads(text)
    assert data["outputs"] == {} and data["outputs_truncated"] is True
    assert data["root_cause"]["message"] == "disk full"


def test_long_messages_are_shortened_to_fit() -> None:
    text = failed({"loss": 1.0}, message="é" * 5000).summary()
    assert len(text.encode()) <= SUMMARY_MAX_BYTES
    back = StepResult.from_summary(text)
    assert back is not None and back.root_cause is not None
    assert back.root_cause.message is not None and back.root_cause.message.endswith("…")


def test_text_that_is_not_a_summary_reads_as_none() -> None:
    for text in (None, "", "Traceback (most recent call last):", "[1, 2]", '{"state": "FAILED"}'):
        assert StepResult.from_summary(text) is None
