"""torchstep.steps.ids: run ids from the orchestrator's identifiers, Attempt, the one retry suffix."""

from __future__ import annotations

import pytest
import torchstep
from torchstep.steps.ids import Attempt, again, as_attempt, retry_run_id, run_id_of, step_run_id


@pytest.mark.parametrize(
    "parts",
    [
        ("dag", "task", "manual__2026-11-21T10:00:00+00:00", 1),
        ("$(touch pwned)", "{{ ti }}", "a;b", "x y"),
        ("A" * 400,),
        ("flow-run-1", "task-run-7"),
    ],
)
def test_step_run_id_is_dns_safe_deterministic_and_distinct(parts: tuple[object, ...]) -> None:
    rid = step_run_id(*parts)
    assert rid == step_run_id(*parts)
    assert len(rid) <= 200
    assert all(word and word.replace("-", "").isalnum() and word.islower() or word.isdigit() for word in rid.split("."))
    assert step_run_id(*parts, "try2") != rid


def test_step_run_id_never_maps_two_identities_to_one_id() -> None:
    assert step_run_id("Train", "fit") != step_run_id("train", "fit")
    assert step_run_id("a.b", "c") != step_run_id("a", "b.c")
    with pytest.raises(ValueError):
        step_run_id(None, "")


def test_every_retry_of_a_logical_attempt_ends_in_the_one_suffix() -> None:
    logical = Attempt(("kfp", "job-1", "task-7"))
    assert logical.run_id == logical.logical_id == "kfp.job-1.task-7"
    assert logical.again(2).run_id == retry_run_id(logical.run_id, 2) == "kfp.job-1.task-7.try2"
    assert again("nightly", 3) == "nightly.try3" and again("nightly", 1) == "nightly" and again(None, 4) is None
    # an orchestrator's own try keeps its number; a loop inside it nests under it
    tried = Attempt(("dag", "task", "run-1"), try_number=2)
    assert tried.run_id == "dag.task.run-1.try2" and tried.logical_id == "dag.task.run-1"
    assert tried.again(3).run_id == "dag.task.run-1.try2.try3" and tried.again(3).try_number is None


def test_an_attempt_argument_is_an_attempt_its_parts_a_run_id_or_none() -> None:
    assert as_attempt(("flow", "task")) == Attempt(("flow", "task"))
    assert run_id_of(as_attempt(("flow", "task"))) == "flow.task"
    assert run_id_of(as_attempt("exact-id")) == "exact-id" and as_attempt(None) is None
    for bad in ("  ", 7):
        with pytest.raises(torchstep.SpecError) as err:
            as_attempt(bad)  # type: ignore[arg-type]
        assert err.value.field == "attempt" and "Attempt(parts, try_number)" in (err.value.fix or "")
