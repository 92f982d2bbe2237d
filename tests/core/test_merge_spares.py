"""A graceful rendezvous exit alone is no success (issue 33): torch ends an agent that is a
spare of a closed rendezvous as a graceful exit, and the agent reports SUCCEEDED. That is
right beside peers that trained; when every agent of a step left that way, nothing ran (a
rendezvous closed under all of them, e.g. by a forged state), and the step is FAILED."""

from __future__ import annotations

from torchstep.result import FAILED, SUCCEEDED, RankResult, ReplicaResult, StepResult, merge


def _spare(replica_id: int) -> StepResult:
    """An agent's result after a graceful exit before any worker ran (what the runner writes)."""
    return StepResult(
        "app-1",
        SUCCEEDED,
        0,
        message="rendezvous closed: The node 'h_1_0' has closed the rendezvous",
        replicas=[ReplicaResult(role="trainer", replica_id=replica_id, state=SUCCEEDED, exit_code=0)],
    )


def _trained(replica_id: int) -> StepResult:
    rank = RankResult(role="trainer", rank=replica_id, local_rank=0, state=SUCCEEDED, exit_code=0)
    return StepResult(
        "app-1",
        SUCCEEDED,
        0,
        replicas=[ReplicaResult(role="trainer", replica_id=replica_id, state=SUCCEEDED, exit_code=0, ranks=[rank])],
    )


def test_a_step_whose_every_replica_left_as_a_spare_is_failed_with_the_reason() -> None:
    for replicas in ([_spare(0)], [_spare(0), _spare(1)]):
        merged = merge("app-1", replicas)
        assert merged.state == FAILED
        assert merged.exit_code == 1
        assert merged.root_cause is not None
        assert merged.root_cause.message is not None
        assert merged.root_cause.message.startswith("no replica ran its workers: every agent left a closed rendezvous")
        assert "The node 'h_1_0' has closed the rendezvous" in merged.root_cause.message
        assert merged.root_cause.role == "trainer"


def test_a_spare_beside_peers_that_trained_is_a_success() -> None:
    merged = merge("app-1", [_trained(0), _spare(1)])
    assert merged.state == SUCCEEDED
    assert merged.exit_code == 0
    assert merged.root_cause is None


def test_the_rule_survives_the_result_file() -> None:
    """The supervisor merges what it loads from each agent's result.json."""
    loaded = StepResult.from_dict(_spare(0).to_dict())
    assert merge("app-1", [loaded]).state == FAILED
