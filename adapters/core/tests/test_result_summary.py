"""``StepResult.summary()``: the compact result the agent writes as a Kubernetes
termination message (4096 bytes at most), and ``from_summary`` reading it back."""

from __future__ import annotations

import json

from torchstep.result import SUMMARY_MAX_BYTES, RankResult, ReplicaResult, StepResult


def failed(outputs: dict, message: str = "disk full") -> StepResult:
    root = RankResult(
        role="trainer",
        rank=1,
        local_rank=1,
        state="FAILED",
        exit_code=3,
        message=message,
        traceback="Traceback ...\n" * 500,
        timestamp=12.5,
        reason="worker_failed",
        replica_id=0,
    )
    return StepResult(
        app_id="train-1a2b",
        state="FAILED",
        exit_code=3,
        restarts=2,
        root_cause=root,
        replicas=[ReplicaResult(role="trainer", replica_id=0, ranks=[root])],
        outputs=outputs,
        message=f"rank 1 failed: {message}",
    )


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


def _numbers_as_doubles(value: object) -> object:
    """What a store of doubles makes of a result (a KFP STRUCT parameter, protobuf Value)."""
    if isinstance(value, dict):
        return {k: _numbers_as_doubles(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers_as_doubles(v) for v in value]
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def test_from_dict_gives_back_the_types_of_the_schema() -> None:
    original = failed({"loss": 0.5})
    original.duration_s, original.started_at = 4.0, 1700000000.0
    doubled = _numbers_as_doubles(original.to_dict())
    assert isinstance(doubled, dict) and doubled["exit_code"] == 3.0 and isinstance(doubled["exit_code"], float)
    back = StepResult.from_dict(doubled)
    assert back == original and back.root_cause is not None
    for value, kind in (
        (back.exit_code, int),
        (back.restarts, int),
        (back.attempts, int),
        (back.schema, int),
        (back.replicas[0].replica_id, int),
        (back.ranks[0].rank, int),
        (back.ranks[0].local_rank, int),
        (back.root_cause.exit_code, int),
        (back.retryable, bool),
    ):
        assert type(value) is kind, (value, kind)
    # a JSON writer that drops ".0" (Go's protojson on a KFP cluster): floats stay floats
    dropped = {**original.to_dict(), "duration_s": 4, "started_at": 1700000000}
    again = StepResult.from_dict(dropped)
    assert type(again.duration_s) is float and type(again.started_at) is float
    assert json.dumps(again.to_dict()) == json.dumps(original.to_dict())
