"""A result comes only from the Job this step created (issue 24, section 2), in core's
``JobGang`` against the in-memory fake API (tests/kubefake.py; the cross-process version is
in tests/kubernetes/test_durable.py).

Run ids are predictable, so the run's labels are too: someone allowed to create pods (or
Jobs) in the step's namespace can copy them. Pods count only when a Job of the run owns
them (``ownerReferences``, by uid) or they are the run's bare Pod; with a state store,
attaching requires the uid recorded when the run created the workload."""

from __future__ import annotations

import pytest
import torchstep
from kubefake import FakeKube, Script
from statestore import TaskStateStore as Store
from torchstep.kubernetes import JobGang, render_app
from torchstep.kubernetes.ownership import UIDS_KEY
from torchstep.result import SUCCEEDED, StepResult
from torchx import specs

FORGED = StepResult(app_id="x", state=SUCCEEDED, exit_code=0, outputs={"model_uri": "s3://attacker/model"}).summary()
GENUINE = StepResult(app_id="x", state=SUCCEEDED, exit_code=0, outputs={"model_uri": "s3://ours/model"}).summary()
FORGED_LINES = ["[trainer/0] FORGED epoch 1", "[trainer/0] FORGED done"]


def rendered(replicas: int = 2, run_id: str = "run-42"):
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        metadata={"torchstep": {"nproc_per_node": 1}},
    )
    return render_app(specs.AppDef("train", roles=[role]), namespace="ml", cfg={"run_id": run_id})


def genuine(replicas: int = 2) -> dict[int, Script]:
    return {i: Script(lines=[f"[trainer/{i}] step {k}" for k in range(3)], messages=[GENUINE]) for i in range(replicas)}


@pytest.mark.parametrize("replicas", [2, 1])  # an Indexed Job's pods; a bare-Pod role (the pod is the workload)
def test_a_forged_bare_pod_with_replica_0s_labels_is_ignored_and_said_once(replicas: int) -> None:
    fake = FakeKube(genuine(replicas))
    fake.impersonate(FORGED_LINES, FORGED)
    lines: list[str] = []
    result = JobGang(rendered(replicas), fake, on_line=lines.append, poll_interval=0.01).run()
    assert result.state == SUCCEEDED and result.outputs == {"model_uri": "s3://ours/model"}
    assert [r.replica_id for r in result.replicas] == list(range(replicas))  # one result per replica, ours
    assert not [line for line in lines if "FORGED" in line]  # its lines never reach the step log
    warned = [line for line in lines if "ignoring pod" in line]
    assert len(warned) == 1, lines  # once, although it was listed at every poll
    evil = f"{rendered(replicas).roles[0].name}-0-evil"
    assert f"ignoring pod ml/{evil}" in warned[0] and "docs/security.md" in warned[0]
    assert sorted(line for line in lines if "ignoring" not in line) == sorted(
        f"[trainer/{i}] step {k} (pod 0)" for i in range(replicas) for k in range(3)
    )  # the genuine lines, all of them, unchanged
    assert evil not in [c["name"] for c in fake.log_calls]  # never even read


def test_a_pod_owned_by_another_job_is_ignored_too() -> None:
    fake = FakeKube(genuine())
    labels = rendered().roles[0].workload["spec"]["template"]["metadata"]["labels"]
    fake.add_pod("other-0-x", labels, lines=FORGED_LINES, message=FORGED, owner_uid="uid-of-someone-elses-job")
    lines: list[str] = []
    result = JobGang(rendered(), fake, on_line=lines.append, poll_interval=0.01).run()
    assert result.outputs == {"model_uri": "s3://ours/model"} and not [x for x in lines if "FORGED" in x]
    assert [x for x in lines if "ignoring pod ml/other-0-x" in x and "uid-of-someone-elses-job" in x]


@pytest.mark.parametrize("recorded", [None, "uid-of-an-older-job"])
def test_a_forged_job_with_copied_labels_is_refused_by_name_under_a_state_store(recorded: str | None) -> None:
    """The Job exists before the task creates it, with the run's labels copied from
    ``torchstep render``; the task keeps state (Airflow's task state store) and did not
    record that uid: refused by name, nothing deleted, nothing created beside it."""
    fake = FakeKube(genuine())
    forged = rendered().roles[0].workload
    fake.create_namespaced_job("ml", body=forged)  # labels and all: what `torchstep render` prints
    store = Store()
    if recorded:
        store.values[UIDS_KEY] = {forged["metadata"]["name"]: recorded}
    lines: list[str] = []
    with pytest.raises(torchstep.SpecError) as err:
        JobGang(rendered(), fake, on_line=lines.append, poll_interval=0.01, cursor_store=store).run()
    text = str(err.value)
    assert err.value.field == f"Job ml/{forged['metadata']['name']}" and "not created by this run" in text
    assert "has uid uid-0" in text and (f"recorded uid {recorded}" in text if recorded else "no creation" in text)
    assert fake.deleted == [] and fake.deleted_names == []  # someone else's: never deleted
    assert [o["kind"] for o in fake.objects] == ["Job"] and lines == []  # nothing created, nothing read


def test_the_job_this_task_created_is_attached_to_under_the_state_store() -> None:
    fake = FakeKube(genuine())
    store = Store()
    first = JobGang(rendered(), fake, cursor_store=store)
    first.create()  # ... and the watcher dies here
    name = rendered().roles[0].name
    assert store.values[UIDS_KEY] == {name: "uid-0"}  # recorded as soon as the Job existed
    second = JobGang(rendered(), fake, poll_interval=0.01, cursor_store=store)
    assert second.run().outputs == {"model_uri": "s3://ours/model"} and second.attached


def test_the_uid_is_recorded_before_anything_else_and_a_failure_to_record_deletes_what_was_created() -> None:
    class Broken(Store):
        def set(self, key: str, value: object) -> None:
            if key == UIDS_KEY:
                raise OSError("the state store is down")
            super().set(key, value)

    fake = FakeKube(genuine())
    with pytest.raises(OSError, match="state store is down"):
        JobGang(rendered(), fake, poll_interval=0.01, cursor_store=Broken()).run()
    assert [o["kind"] for o in fake.objects] == ["Job"]  # the Service was not created: the uid came first
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}  # and the Job is gone again


def test_a_refusal_after_creating_deletes_only_what_this_run_created_by_name() -> None:
    """Two roles: the first one's Job is created, the second's name is taken by a forged
    Job with the run's labels. The run stops; only its own Job is deleted, by name."""
    roles = [
        specs.Role(
            n,
            image="i:1",
            entrypoint="python",
            args=["-m", n],
            num_replicas=2,
            metadata={"torchstep": {"nproc_per_node": 1}},
        )
        for n in ("a", "b")
    ]
    ra = render_app(specs.AppDef("two", roles=roles), namespace="ml", cfg={"run_id": "r"})
    fake = FakeKube(genuine())
    forged = dict(ra.roles[1].workload)
    fake.create_namespaced_job("ml", body=forged)
    with pytest.raises(torchstep.SpecError, match=f"Job ml/{forged['metadata']['name']}"):
        JobGang(ra, fake, poll_interval=0.01, cursor_store=Store()).run()
    assert fake.deleted == [] and fake.deleted_names == [("jobs", f"metadata.name={ra.roles[0].name}")]


def test_an_existing_service_not_owned_by_the_runs_job_is_refused() -> None:
    """A headless Service named like the run's, with its labels but another owner, could
    point replica 0's rendezvous name elsewhere."""
    fake = FakeKube(genuine())
    ra = rendered()
    service = dict(ra.roles[0].service)
    service["metadata"] = {
        **service["metadata"],
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "x", "uid": "uid-someone-else"}],
    }
    fake.create_namespaced_service("ml", body=service)
    with pytest.raises(torchstep.SpecError) as err:
        JobGang(ra, fake, poll_interval=0.01).run()
    assert err.value.field == f"Service ml/{service['metadata']['name']}"
    assert f"not owned by Job {ra.roles[0].name}" in str(err.value)
