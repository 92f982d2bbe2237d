"""Kueue, as platform teams run it (issue 36, goal 4), offline: what the ``queue`` option
renders (a suspended Job in a LocalQueue), what passes through to Kueue (partial admission,
topology), and the watcher's transitions (queued → admitted → evicted → admitted) against
the recorded fake API (tests/kubefake.py). The same contract on real pods:
tests/cluster/test_kueue.py."""

from __future__ import annotations

import types
from typing import Any

import pytest
from kubefake import FakeKube, Script
from torchstep.errors import SpecError
from torchstep.kubernetes import JobGang, render_app
from torchx import specs

QUEUE = "kueue.x-k8s.io/queue-name"
MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"
TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"


def app(replicas: int = 2, min_replicas: int | None = None, overlay: dict[str, Any] | None = None) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        min_replicas=min_replicas,
        metadata={"kubernetes": overlay} if overlay else {},
    )
    return specs.AppDef("train", roles=[role])


def test_a_queued_job_is_created_suspended_in_its_local_queue(check: Any) -> None:
    rendered = render_app(app(), namespace="ml", cfg={"run_id": "r", "queue": "team-a"})
    check(rendered)  # strict schemas and the API server's rules
    job = rendered.roles[0].workload
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE] == "team-a"
    assert QUEUE not in job["spec"]["template"]["metadata"]["labels"]  # Kueue reads the Job's label
    plain = render_app(app(), namespace="ml", cfg={"run_id": "r"}).roles[0].workload
    assert "suspend" not in plain["spec"] and QUEUE not in plain["metadata"]["labels"]


def test_a_queued_bare_pod_carries_the_label_for_kueues_pod_integration() -> None:
    rendered = render_app(app(replicas=1), namespace="ml", cfg={"run_id": "r", "queue": "team-a"})
    assert rendered.roles[0].kind == "Pod"
    pod = rendered.roles[0].workload
    assert pod["metadata"]["labels"][QUEUE] == "team-a" and "suspend" not in pod["spec"]


def test_partial_admission_and_topology_pass_through_to_kueue() -> None:
    overlay = {"metadata": {"annotations": {MIN_PARALLELISM: "2", TOPOLOGY: "cloud.example.com/rack"}}}
    rendered = render_app(app(replicas=4, min_replicas=2, overlay=overlay), cfg={"run_id": "r", "queue": "q"})
    job = rendered.roles[0].workload
    assert job["metadata"]["annotations"][MIN_PARALLELISM] == "2"  # Kueue reads it on the Job
    assert job["spec"]["template"]["metadata"]["annotations"][TOPOLOGY] == "cloud.example.com/rack"  # on the pod set
    by_option = render_app(app(replicas=4, min_replicas=3), cfg={"run_id": "r", "annotations": f"{MIN_PARALLELISM}:3"})
    assert by_option.roles[0].workload["metadata"]["annotations"][MIN_PARALLELISM] == "3"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("1", "which needs 2 to form its rendezvous"),
        ("five", "is not a whole number of pods in 1..4"),
        ("9", "is not a whole number of pods in 1..4"),
    ],
)
def test_partial_admission_below_the_rendezvous_minimum_is_refused(value: str, problem: str) -> None:
    overlay = {"metadata": {"annotations": {MIN_PARALLELISM: value}}}
    with pytest.raises(SpecError, match=rf"roles\[0\]: annotation {MIN_PARALLELISM}") as err:
        render_app(app(replicas=4, min_replicas=2, overlay=overlay), cfg={"run_id": "r"})
    assert problem in str(err.value) and "fix:" in str(err.value)


class Queued(FakeKube):
    """FakeKube whose Job is suspended for the reads ``suspended`` lists (True: suspended),
    then admitted: while suspended no pod exists and none progresses."""

    def __init__(self, *args: Any, suspended: list[bool], selector: dict[str, str] | None = None, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan = list(suspended)
        self.selector = selector
        self.now_suspended = bool(self.plan and self.plan[0])

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        self.now_suspended = self.plan.pop(0) if self.plan else False
        if self.now_suspended:
            self.reads -= 1  # the read below counts one: a suspended Job's pods neither start nor progress
        job = super().read_namespaced_job_status(name, namespace)
        template = types.SimpleNamespace(
            spec=types.SimpleNamespace(node_selector=None if self.now_suspended else self.selector)
        )
        job.spec = types.SimpleNamespace(suspend=self.now_suspended, template=template)
        return job

    def _pod_list(self) -> list[Any]:
        return [] if self.now_suspended else super()._pod_list()


def run_queued(fake: FakeKube, **cfg: Any) -> tuple[str, Any, list[str]]:
    rendered = render_app(app(), namespace="ml", cfg={"run_id": "run-9", "queue": "team-a", **cfg})
    lines: list[str] = []
    result = JobGang(rendered, fake, on_line=lines.append, poll_interval=0.01).run()
    return rendered.roles[0].name, result, [x for x in lines if x.startswith("torchstep:")]


def test_the_watcher_says_queued_admitted_evicted_and_the_eviction_is_a_preemption_not_a_failure() -> None:
    fake = Queued(
        {0: Script(), 1: Script()}, suspended=[True] * 3 + [False] * 2 + [True] * 2, selector={"pool": "a100"}
    )
    name, result, said = run_queued(fake)
    waiting = "(waiting for admission by Kueue, queue team-a)"
    assert said == [
        f"torchstep: Job {name} queued {waiting}",
        f"torchstep: Job {name} admitted by Kueue (queue team-a), nodeSelector {{'pool': 'a100'}}: starting",
        f"torchstep: Job {name} was evicted (suspended again, its pods deleted): preemption 1 of at most 10 "
        f"(preemption_retries); the step's retries are untouched; queued again {waiting}",
        f"torchstep: Job {name} admitted by Kueue (queue team-a), nodeSelector {{'pool': 'a100'}}: starting",
    ]
    assert result.state == "SUCCEEDED", result.summary()
    assert result.warnings == [
        "preempted 1 time (0 pod(s) with DisruptionTarget, 1 Kueue eviction(s)); preemption_retries=10; "
        "the step's retries are untouched"
    ]


def test_an_eviction_beyond_the_budget_ends_the_step_preempted() -> None:
    fake = Queued({0: Script(), 1: Script()}, suspended=[True, False, True, True])
    _, result, said = run_queued(fake, preemption_retries=0)
    assert result.state == "PREEMPTED" and result.retryable is False, result.summary()
    assert "preempted 1 time, more than preemption_retries=0 allows" in result.message
    assert said[-1].endswith("queued again (waiting for admission by Kueue, queue team-a)")
    assert any(kind == "jobs" for kind, _, _ in fake.deleted)  # nothing of it is left waiting in the queue
