"""Attach or create (``JobGang.create``) against the in-memory fake API (tests/kubefake.py):
a watcher run again with the same run id finds its Job and attaches instead of starting a
second one, continues the logs after the saved cursor, and refuses an object it did not
create. The cross-process version (a SIGKILLed watcher) is tests/kubernetes/test_durable.py."""

from __future__ import annotations

import pytest
import torchstep
from kubefake import FakeKube, Script
from statestore import TaskStateStore as Store
from torchstep.kubernetes import JobGang, render_app
from torchstep.kubernetes.jobs import CURSOR_ANNOTATION, CURSOR_KEY
from torchstep.result import FAILED, RUNNING, SUCCEEDED, StepResult
from torchx import specs


def app(replicas: int = 2) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        metadata={"torchstep": {"nproc_per_node": 2}},
    )
    return specs.AppDef("train", roles=[role])


def rendered(run_id: str = "run-42"):
    return render_app(app(), namespace="ml", cfg={"run_id": run_id})


def scripts(n: int = 2, lines: int = 8) -> dict[int, Script]:
    return {i: Script(lines=[f"[trainer/{2 * i}] step {k}" for k in range(lines)]) for i in range(n)}


def test_a_second_watcher_attaches_to_the_running_job_instead_of_creating_another() -> None:
    fake = FakeKube(scripts())
    first = JobGang(rendered(), fake, poll_interval=0.01)
    first.create()  # ... and the watcher dies here
    assert first.attached is False
    lines: list[str] = []
    second = JobGang(rendered(), fake, on_line=lines.append, poll_interval=0.01)
    result = second.run()
    assert second.attached is True
    assert [o["kind"] for o in fake.objects] == ["Job", "Service", "NetworkPolicy"]  # one of each: nothing new
    assert fake.conflicts == 3  # the Job, its Service and its NetworkPolicy existed
    assert result.state == SUCCEEDED and [r.replica_id for r in result.replicas] == [0, 1]
    assert len(lines) == 16  # nobody saved a cursor: every line is read


def test_state_reads_the_cluster_without_changing_it() -> None:
    fake = FakeKube(scripts(), polls=3)
    js = JobGang(rendered(), fake, poll_interval=0.01)
    assert js.state() is None  # nothing created yet
    js.create()
    assert js.state() == RUNNING
    while js.state() == RUNNING:
        pass
    assert js.state() == SUCCEEDED
    assert len(fake.objects) == 3  # the Job, its Service and its NetworkPolicy


def test_a_job_that_finished_while_nobody_watched_returns_its_result_without_a_rerun() -> None:
    fake = FakeKube({0: Script(codes=[1], messages=[None]), 1: Script()})
    JobGang(rendered(), fake).create()
    while fake.reads <= 10:  # the pods run to their end meanwhile
        fake.read_namespaced_job_status(rendered().roles[0].name, "ml")
    result = JobGang(rendered(), fake, poll_interval=0.01).run()
    assert result.state == FAILED and "trainer replica 0 exited 1" in (result.message or "")
    assert sum(o["kind"] == "Job" for o in fake.objects) == 1


def test_an_object_of_the_same_name_without_our_labels_is_refused_and_left_alone() -> None:
    fake = FakeKube(scripts())
    foreign = rendered().roles[0].workload
    foreign["metadata"]["labels"] = {"team": "other"}
    fake.create_namespaced_job("ml", body=foreign)
    with pytest.raises(torchstep.SpecError) as err:
        JobGang(rendered(), fake, poll_interval=0.01).run()
    text = str(err.value)
    assert f"Job ml/{foreign['metadata']['name']}" in text and "not created by this run" in text
    assert "delete that object" in text
    # the cleanup deleted only by our selector: the foreign Job has no torchstep/app-id label
    assert all("torchstep/app-id=" in sel for kind, sel, _ in fake.deleted if kind in ("jobs", "pods"))
    assert fake.objects[0]["metadata"]["labels"] == {"team": "other"}


def test_the_reattached_watcher_continues_the_logs_after_the_saved_cursor() -> None:
    fake = FakeKube(scripts())
    store = Store()
    first_lines: list[str] = []
    first = JobGang(
        rendered(), fake, on_line=first_lines.append, poll_interval=0.01, on_finish="keep", cursor_store=store
    )
    first.run()  # read everything, saved its cursor at the end, then "died" before reporting
    assert CURSOR_KEY in store.values and len(first_lines) == 16
    again: list[str] = []
    second = JobGang(rendered(), fake, on_line=again.append, poll_interval=0.01, cursor_store=store)
    assert second.run().state == SUCCEEDED and second.attached
    assert again == []  # nothing is repeated: every line was delivered before the cursor


def test_the_cursor_is_saved_on_the_workload_for_watchers_without_a_store() -> None:
    fake = FakeKube(scripts())
    first = JobGang(rendered(), fake, on_line=lambda _: None, poll_interval=0.01, on_finish="keep")
    first.run()
    first.save_cursor()  # throttled: nothing new since the last save
    first._saved = {}  # as if the periodic save in wait() ran after the last line
    first.save_cursor()
    assert fake.patches and fake.patches[-1][0] == "Job"
    assert CURSOR_ANNOTATION in fake.patches[-1][2]["metadata"]["annotations"]
    again: list[str] = []
    second = JobGang(rendered(), fake, on_line=again.append, poll_interval=0.01)
    second.run()
    assert second.attached and again == []


def test_a_malformed_saved_cursor_means_reading_from_the_start_not_a_failure() -> None:
    fake = FakeKube(scripts(1, 3))
    store = Store()
    JobGang(rendered(), fake, cursor_store=store).create()  # the dead watcher: the same task, the same store
    store.values[CURSOR_KEY] = {"pods": {"x": ["not a time", -1], "y": "junk"}}
    lines: list[str] = []
    result = JobGang(rendered(), fake, on_line=lines.append, poll_interval=0.01, cursor_store=store).run()
    assert result.state == SUCCEEDED and len(lines) == 3


def test_a_step_result_summary_survives_the_reattach() -> None:
    message = StepResult(app_id="x", state=SUCCEEDED, exit_code=0, outputs={"loss": 0.25}).summary()
    fake = FakeKube({0: Script(messages=[message]), 1: Script(messages=[message])})
    JobGang(rendered(), fake).create()
    result = JobGang(rendered(), fake, poll_interval=0.01).run()
    assert result.state == SUCCEEDED and result.outputs == {"loss": 0.25}


def test_a_watcher_that_died_midway_delivers_exactly_the_lines_after_its_cursor() -> None:
    from kubefake import _ts
    from torchstep.kubernetes.logcursor import _ts_key

    fake = FakeKube(scripts(1, 8))
    store = Store()
    JobGang(rendered(), fake, cursor_store=store).create()
    pod = fake._pod_list()[0].metadata.name
    # the dead watcher had delivered lines 0..4: line 4 shares its timestamp with line 5
    key = _ts_key(_ts(4))
    store.values[CURSOR_KEY] = {"pods": {pod: [key, 1]}}
    lines: list[str] = []
    JobGang(rendered(), fake, on_line=lines.append, poll_interval=0.01, cursor_store=store).run()
    assert lines == [f"[trainer/0] step {k} (pod 0)" for k in range(5, 8)]


def test_an_attached_runs_start_and_duration_are_the_jobs_not_the_second_watchers() -> None:
    import time

    fake = FakeKube(scripts(), polls=3)
    first = JobGang(rendered(), fake, poll_interval=0.01)
    first.create()  # ... and the watcher dies here
    created = time.time()
    time.sleep(1.5)  # the orchestrator notices and runs the step again
    reattached = time.time()
    result = JobGang(rendered(), fake, poll_interval=0.01).run()
    assert result.started_at is not None and result.started_at <= created < reattached
    assert result.duration_s >= 1.5  # measured from the Job's status.startTime
