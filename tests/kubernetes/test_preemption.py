"""Preemption is not failure (issue 36, goal 3), offline: the rendered Jobs ignore pods with
``DisruptionTarget`` in every retry policy, the watcher (JobGang, against tests/kubefake.py)
counts preemptions against ``preemption_retries`` and never against the step's retries, and
the result says PREEMPTED (TorchX: FAILED with the reason) only when that budget is spent; a
preempted bare Pod, which Kubernetes never replaces, is created again by the watcher."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torchstep
from kubefake import FakeKube, Script
from torchstep.errors import SpecError
from torchstep.kubernetes import JobGang, render_app
from torchstep.result import StepResult, StepState
from torchstep.schedulers.base import app_state
from torchx import specs

IGNORE_DISRUPTED = {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def app(replicas: int = 2, policy: Any = specs.RetryPolicy.REPLICA, retries: int = 2) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        max_retries=retries,
        retry_policy=policy,
    )
    return specs.AppDef("train", roles=[role])


class Disrupting(FakeKube):
    """FakeKube whose listed pods carry ``DisruptionTarget`` where ``disrupted`` says
    (pod names of the first incarnation: ``<job>-<index>-a``; a bare Pod: its name)."""

    def __init__(self, *args: Any, disrupted: tuple[str, ...] = (), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.disrupted = disrupted

    def _pod_list(self) -> list[Any]:
        pods = super()._pod_list()
        for pod in pods:
            if any(pod.metadata.name.endswith(suffix) for suffix in self.disrupted):
                pod.status.conditions = [
                    types.SimpleNamespace(
                        type="DisruptionTarget",
                        status="True",
                        reason="PreemptionByScheduler",
                        message="preempted by a higher-priority pod",
                    )
                ]
        return pods


def run(fake: FakeKube, application: specs.AppDef, **cfg: Any) -> tuple[JobGang, StepResult, list[str]]:
    rendered = render_app(application, namespace="ml", cfg={"run_id": "run-7", **cfg})
    lines: list[str] = []
    gang = JobGang(rendered, fake, on_line=lines.append, poll_interval=0.01)
    return gang, gang.run(), lines


@pytest.mark.parametrize("policy", [specs.RetryPolicy.REPLICA, specs.RetryPolicy.APPLICATION, "ROLE"])
def test_every_job_ignores_disrupted_pods_after_the_non_retryable_rule(policy: Any, check: Any) -> None:
    rendered = render_app(app(policy=policy), namespace="ml", cfg={"run_id": "r"})
    check(rendered)  # strict schemas and the API server's rules (Ignore needs restartPolicy Never)
    spec = rendered.roles[0].workload["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0]["onExitCodes"]["values"] == [82] and rules[1] == IGNORE_DISRUPTED
    assert spec["template"]["spec"]["restartPolicy"] == "Never"


def test_preemption_retries_is_a_run_option_with_its_own_default_and_checked() -> None:
    assert render_app(app(), cfg={"run_id": "r"}).options.preemption_retries == 10
    assert render_app(app(), cfg={"run_id": "r", "preemption_retries": "3"}).options.preemption_retries == 3
    with pytest.raises(SpecError, match=r"cfg\['preemption_retries'\].*must not be negative"):
        render_app(app(), cfg={"run_id": "r", "preemption_retries": -1})
    assert "preemption_retries" in str(torchstep.kubernetes.cfg_table())


def test_a_preempted_replica_is_replaced_and_the_step_succeeds_with_its_retries_untouched() -> None:
    # replica 1's first pod is preempted (its agent SIGTERMed: 143), its replacement succeeds
    fake = Disrupting({0: Script(), 1: Script(codes=[143, 0])}, disrupted=("-1-a",))
    _, result, lines = run(fake, app())
    assert result.state == "SUCCEEDED", result.summary()
    assert result.retryable is False  # succeeded: nothing to retry
    (note,) = [w for w in result.warnings if w.startswith("preempted")]
    assert note.startswith(
        "preempted 1 time (1 pod(s) with DisruptionTarget, 0 Kueue eviction(s)); preemption_retries=10"
    )
    said = [x for x in lines if "was preempted" in x]
    assert len(said) == 1 and "PreemptionByScheduler" in said[0] and "preemption 1 of at most 10" in said[0]
    assert "resuming from the step's checkpoint" in said[0]


def test_more_preemptions_than_the_budget_end_the_step_preempted_and_not_retryable() -> None:
    fake = Disrupting({0: Script(codes=[143, 0]), 1: Script(codes=[143, 0])}, disrupted=("-0-a", "-1-a"))
    gang, result, _ = run(fake, app(policy=specs.RetryPolicy.APPLICATION, retries=3), preemption_retries=1)
    assert result.state == StepState.PREEMPTED, result.summary()
    assert result.retryable is False  # the step's own retries (APPLICATION, 3) are never spent on it
    assert result.message.startswith("preempted 2 times, more than preemption_retries=1 allows")
    assert "fix: raise preemption_retries" in result.message
    assert ("jobs", gang.rendered.label_selector, "Foreground") in fake.deleted  # nothing keeps running
    assert result.app_status().state.name == "FAILED" and app_state("PREEMPTED").name == "FAILED"


class PreemptedBarePod(FakeKube):
    """A bare Pod whose first incarnation is evicted (``DisruptionTarget``, still terminating):
    deleting it by name removes it, creating it again starts an incarnation that succeeds."""

    def __init__(self) -> None:
        super().__init__({0: Script(codes=[0])}, polls=2)
        self.incarnation = 0
        self.gone = False

    def _pod_list(self) -> list[Any]:
        if self.gone:
            return list(self.extra_pods)
        pods = super()._pod_list()
        if self.incarnation == 0:
            for pod in pods:
                pod.status.conditions = [
                    types.SimpleNamespace(
                        type="DisruptionTarget", status="True", reason="EvictionByEvictionAPI", message=""
                    )
                ]
        return pods

    def delete_collection_namespaced_pod(
        self, namespace: str, label_selector: str, propagation_policy: Any = None, field_selector: str | None = None
    ) -> None:
        super().delete_collection_namespaced_pod(namespace, label_selector, propagation_policy, field_selector)
        if field_selector is not None:  # the preempted pod, by name: gone once deleted
            name = field_selector.partition("=")[2]
            self.objects = [o for o in self.objects if not (o["kind"] == "Pod" and o["metadata"]["name"] == name)]
            self.gone = True

    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.gone:
            self.gone, self.incarnation, self.reads = False, self.incarnation + 1, 0
        return super().create_namespaced_pod(namespace, body)


def test_a_preempted_bare_pod_is_created_again_by_the_watcher_from_the_same_budget() -> None:
    fake = PreemptedBarePod()
    rendered = render_app(torchstep.materialize("utils.echo", ["--msg", "hi"]), namespace="ml", cfg={"run_id": "r1"})
    name = rendered.roles[0].name
    assert rendered.roles[0].kind == "Pod"
    lines: list[str] = []
    gang = JobGang(rendered, fake, on_line=lines.append, poll_interval=0.01)
    result = gang.run()
    assert result.state == "SUCCEEDED", result.summary()
    assert fake.deleted_names == [("pods", f"metadata.name={name}")]  # the preempted pod, by name
    assert [o["metadata"]["name"] for o in fake.objects if o["kind"] == "Pod"] == [name]  # one pod, created again
    assert gang.owners.uid(name) == fake.objects[-1]["metadata"]["uid"]  # the new pod is the run's
    said = [x for x in lines if x.startswith("torchstep:")]
    assert said[0].startswith(
        f"torchstep: pod {name} was preempted (DisruptionTarget: EvictionByEvictionAPI); "
        "torchstep creates it again, resuming from the step's checkpoint; preemption 1 of"
    )
    assert said[1] == f"torchstep: pod {name} created again after its preemption"
    assert any(w.startswith("preempted 1 time (1 pod(s)") for w in result.warnings)


def test_the_state_is_a_step_state_and_its_result_file_round_trips() -> None:
    result = StepResult("a-1", "PREEMPTED", 143, retryable=False, message="preempted 11 times")
    again = StepResult.from_dict(result.to_dict())
    assert again.state == StepState.PREEMPTED and again.retryable is False and again.message == "preempted 11 times"
