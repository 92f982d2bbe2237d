"""torchstep.steps.kubernetes: a try by run id attaches; a logical attempt's try is found by one
list of pods at run time (afresh past a kept failed try); the grace period is the pods' own."""

from __future__ import annotations

from typing import Any

import pytest
import torchstep
from kubefake import FakeKube, Script
from torchstep.errors import RunError
from torchstep.result import FAILED, SUCCEEDED
from torchstep.steps import Attempt, KubernetesStep, open_step
from torchstep.steps import kubernetes as kube_step
from torchx import specs


def plan(replicas: int = 2, **metadata: Any) -> Any:
    role = specs.Role(
        "w",
        image="img",
        entrypoint="python",
        num_replicas=replicas,
        metadata={"torchstep": metadata} if metadata else {},
    )
    return torchstep.build_plan(specs.AppDef("k", roles=[role]), "kubernetes")


class Counting(FakeKube):
    """The fake API, counting the calls that find a try."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pod_lists = 0
        self.status_reads = 0

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self.pod_lists += 1
        return super().list_namespaced_pod(namespace, label_selector)

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        self.status_reads += 1
        return super().read_namespaced_job_status(name, namespace)


def test_a_rerun_of_the_same_try_attaches_to_its_jobs_and_says_so_once_when_it_runs() -> None:
    fake = FakeKube({0: Script(), 1: Script()})
    lines: list[str] = []
    first = open_step(
        plan(), attempt="job-1.task", cfg={"namespace": "ml"}, client=fake, on_line=lines.append, poll_interval=0.01
    )
    assert first.found is None
    first.job_gang().create()  # its watcher died here
    again = open_step(
        plan(), attempt="job-1.task", cfg={"namespace": "ml"}, client=fake, on_line=lines.append, poll_interval=0.01
    )
    assert not any("attaching" in line for line in lines)  # nothing is said, or read, at open
    result = again.run()
    assert result.state == SUCCEEDED and again.attached and again.found == "RUNNING"
    attaching = [line for line in lines if "attaching" in line]
    assert attaching == [
        "torchstep: the Jobs of job-1.task exist (an earlier try of this step created them): attaching"
    ]
    assert sum(o["kind"] == "Job" for o in fake.objects) == 1


def test_a_logical_attempt_starts_afresh_after_a_kept_failed_try_with_one_list_of_pods() -> None:
    fake = Counting({0: Script(codes=[1]), 1: Script()})
    attempt = Attempt(("kfp", "run-1", "task-7"))
    first = open_step(
        plan(), attempt=attempt, client=fake, cfg={"namespace": "ml"}, poll_interval=0.01, on_finish="keep"
    )
    assert fake.pod_lists == 0 and fake.status_reads == 0  # nothing read at open
    assert first.run().state == FAILED and first.run_id == "kfp.run-1.task-7"
    fake.pod_lists = fake.status_reads = 0
    retry = open_step(plan(), attempt=attempt, client=fake, cfg={"namespace": "ml"})
    assert (
        isinstance(retry, KubernetesStep) and retry.run_id == "kfp.run-1.task-7.try2"
    )  # the same suffix as run_tries'
    assert retry.found is None  # a fresh try: nothing of it exists
    assert fake.pod_lists == 1 and fake.status_reads <= 2  # the kept try's state, then the fresh one's


def test_a_logical_attempt_with_too_many_kept_failures_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_step, "MAX_KEPT_TRIES", 1)
    fake = FakeKube({0: Script(codes=[1]), 1: Script()})
    attempt = Attempt(("kfp", "run-1", "task-8"))
    open_step(plan(), attempt=attempt, client=fake, poll_interval=0.01, on_finish="keep").run()
    with pytest.raises(RunError) as err:
        open_step(plan(), attempt=attempt, client=fake).run()
    assert err.value.retryable is False and "on_finish='delete'" in str(err.value)


def test_a_run_id_and_a_logical_attempt_are_not_both_given() -> None:
    with pytest.raises(torchstep.SpecError) as err:
        KubernetesStep(plan(), run_id="a", logical_attempt="b")
    assert err.value.field == "logical_attempt"


def test_the_wait_after_a_cancel_is_the_pods_grace_period_not_a_literal() -> None:
    default = KubernetesStep(plan(), run_id="r")
    graced = KubernetesStep(plan(grace_period=100), run_id="r")
    pod_spec = graced.rendered.roles[0].template["spec"]
    assert graced.grace_s == pod_spec["terminationGracePeriodSeconds"] >= 100
    assert default.grace_s == pytest.approx(
        default.rendered.roles[0].template["spec"].get("terminationGracePeriodSeconds", 30)
    )


def test_a_step_made_directly_attaches_without_a_note_unless_asked() -> None:
    fake = FakeKube({0: Script(), 1: Script()})
    KubernetesStep(plan(), run_id="direct-1", client=fake).job_gang().create()  # its watcher died here
    lines: list[str] = []
    again = KubernetesStep(plan(), run_id="direct-1", client=fake, on_line=lines.append, poll_interval=0.01)
    assert again.run().state == SUCCEEDED and again.attached
    assert not any(line.startswith("torchstep: ") for line in lines)  # the caller says what it wants said
