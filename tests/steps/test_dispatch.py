"""torchstep.steps.dispatch and .backend: open_step picks the kind from the plan, refuses what
it cannot run with the field and the fix, and reads nothing before run()."""

from __future__ import annotations

from typing import Any

import pytest
import torchstep
from torchstep.steps import Attempt, KubernetesStep, LocalStep, StepBackend, open_step
from torchx import specs


def app(replicas: int = 1) -> specs.AppDef:
    return specs.AppDef("k", roles=[specs.Role("w", image="img", entrypoint="python", num_replicas=replicas)])


class NoCluster:
    """A Kubernetes client that fails the test on any call: open_step must make none."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"open_step called the cluster: {name}")


def test_open_step_picks_the_kind_from_the_plan_and_both_are_step_backends() -> None:
    local = open_step(torchstep.build_plan(app(), "local"), attempt=Attempt(("flow", "run-1", "task"), 3))
    assert isinstance(local, LocalStep) and local.run_id == "flow.run-1.task.try3"
    kube = open_step(torchstep.build_plan(app(2), "kubernetes"), attempt="job-1.task", client=NoCluster())  # type: ignore[arg-type]
    assert isinstance(kube, KubernetesStep) and kube.run_id == "job-1.task"
    assert isinstance(local, StepBackend) and isinstance(kube, StepBackend)


def test_open_step_reads_no_cluster_for_any_kind_of_attempt() -> None:
    plan = torchstep.build_plan(app(2), "kubernetes")
    for attempt in ("job-1.task", Attempt(("kfp", "job", "task")), Attempt(("airflow", "run"), 2), None):
        step = open_step(plan, attempt=attempt, client=NoCluster(), cfg={"namespace": "ml"})  # type: ignore[arg-type]
        assert isinstance(step, KubernetesStep)
    logical = open_step(plan, attempt=Attempt(("kfp", "job", "task")), client=NoCluster())  # type: ignore[arg-type]
    assert logical.logical_attempt == "kfp.job.task"  # its try is found when it runs


def test_open_step_refuses_a_plan_it_cannot_run_and_an_option_of_the_other_kind() -> None:
    with pytest.raises(torchstep.SpecError) as err:
        open_step(torchstep.build_plan(app(), "kfp"), attempt="r")
    assert err.value.field == "plan" and "build_plan(app, 'kubernetes')" in (err.value.fix or "")
    with pytest.raises(torchstep.SpecError) as err:
        LocalStep(app(), run_id="r")  # type: ignore[arg-type]  # an AppDef, not a plan: planned once, by the caller
    assert err.value.field == "plan"
    with pytest.raises(torchstep.SpecError) as err:
        open_step(torchstep.build_plan(app(), "local"), attempt="r", poll_interval=1.0)
    assert err.value.field == "poll_interval" and err.value.target == "local"
    with pytest.raises(torchstep.SpecError) as err:
        open_step(torchstep.build_plan(app(), "kubernetes"), attempt="r", app_id="mine")
    assert err.value.field == "app_id" and "leave app_id out" in (err.value.fix or "")


def test_a_try_refuses_a_second_retry_layer_and_a_foreign_run_id() -> None:
    plan = torchstep.build_plan(app(), "local")
    with pytest.raises(torchstep.SpecError) as err:
        LocalStep(plan, run_id="a", cfg={"retries": 2})
    assert err.value.field == "cfg['retries']"
    for kind, target in ((LocalStep, "local"), (KubernetesStep, "kubernetes")):
        with pytest.raises(torchstep.SpecError) as err:
            kind(torchstep.build_plan(app(), target), run_id="a", cfg={"run_id": "b"})  # type: ignore[operator]
        assert err.value.field == "cfg['run_id']"


def test_the_try_number_is_given_at_construction() -> None:
    step = open_step(torchstep.build_plan(app(), "local"), attempt="r", try_number=2)
    assert step.try_number == 2
