"""One Enum of step states, one retryable rule, and the two errors that say why a step did
not run (issue 25 §3): ``SpecError`` for bad input, ``RunError`` for a run-time failure."""

from __future__ import annotations

import json
import pickle

import torchstep
from torchstep.errors import RunError, SpecError
from torchstep.result import (
    CANCELLED,
    FAILED,
    SUCCEEDED,
    ReplicaResult,
    StepResult,
    StepState,
    is_final_failure,
    is_retryable,
    merge,
)


def test_a_state_is_its_name_as_a_plain_string() -> None:
    assert torchstep.StepState is StepState
    assert (SUCCEEDED, FAILED, CANCELLED) == (StepState.SUCCEEDED, StepState.FAILED, StepState.CANCELLED)
    assert StepState.FAILED == "FAILED" and str(StepState.FAILED) == "FAILED" and f"{StepState.FAILED}" == "FAILED"
    assert json.dumps({"state": StepState.CANCELLED}) == '{"state": "CANCELLED"}'
    assert StepState("STOPPED") is StepState.STOPPED and "REPORTED" in {s.value for s in StepState}
    assert {"SUCCEEDED": 1}[StepState.SUCCEEDED] == 1  # hashes as the string


def test_the_result_file_keeps_plain_strings() -> None:
    r = StepResult("a-1", FAILED, 3, replicas=[ReplicaResult("w", 0, FAILED, 3)])
    data = r.to_dict()
    assert type(data["state"]) is str and type(data["replicas"][0]["state"]) is str
    assert json.loads(r.to_json())["state"] == "FAILED"
    assert StepResult.from_dict(data) == r and pickle.loads(pickle.dumps(data)) == data


def test_cancelled_is_never_retryable_and_a_cancelled_replica_does_not_end_the_step() -> None:
    assert not is_retryable("CANCELLED") and not is_retryable(StepState.CANCELLED)
    assert StepResult("a-1", "CANCELLED", 143).retryable is False
    assert StepResult.from_dict({**StepResult("a-1", "CANCELLED", 143).to_dict(), "retryable": True}).retryable is False
    # an agent cannot tell a preemption from a stop: the step's own state decides
    preempted = StepResult("a-1", "CANCELLED", 143, replicas=[ReplicaResult("w", 0, "CANCELLED", 143)])
    failed = StepResult("a-1", "FAILED", 1, replicas=[ReplicaResult("w", 1, "FAILED", 1)])
    assert not is_final_failure(preempted) and merge("a-1", [preempted, failed]).state == "CANCELLED"
    assert merge("a-1", [preempted, failed], state="FAILED").retryable is True
    assert (
        merge("a-1", [preempted, StepResult("a-1", "FAILED", 82, retryable=False)], state="FAILED").retryable is False
    )


def test_a_run_error_names_what_failed_says_the_fix_and_pickles() -> None:
    err = RunError("Job ml/train-1a2b", "the API server refused it (HTTP 503); fix: retry later")
    assert str(err) == "Job ml/train-1a2b: the API server refused it (HTTP 503); fix: retry later"
    assert torchstep.RunError is RunError and isinstance(err, RuntimeError) and not isinstance(err, SpecError)
    back = pickle.loads(pickle.dumps(RunError("attempt 'x'", "kept; fix: delete them", retryable=False)))
    assert (back.what, back.reason, back.retryable) == ("attempt 'x'", "kept; fix: delete them", False)
    assert err.retryable is True
