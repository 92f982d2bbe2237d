"""torchstep.kubernetes.JobGang against the recorded fake API (tests/kubefake.py): the
objects it creates, every pod's log lines (replaced pods and dropped streams included),
the merged step result, cancel and cleanup on every exit path."""

from __future__ import annotations

import threading
import time

import kubernetes_validate
import pytest
import torchstep
from kubefake import FakeKube, Script
from torchstep.kubernetes import LABEL_APP_ID, MIN_KUBERNETES_VERSION, JobGang, render_app
from torchstep.result import StepResult
from torchx import specs


def rendered(replicas: int = 2, **role_kw):
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        metadata={"torchstep": {"nproc_per_node": 2}},
        **role_kw,
    )
    return render_app(specs.AppDef("train", roles=[role]), namespace="ml", cfg={"run_id": "run-42"})


def run(fake: FakeKube, replicas: int = 2, **kw) -> tuple[JobGang, StepResult, list[str]]:
    lines: list[str] = []
    js = JobGang(rendered(replicas), fake, on_line=lines.append, poll_interval=0.01, **kw)
    return js, js.run(), lines


def summary(state: str = "SUCCEEDED", code: int = 0, **kw) -> str:
    return StepResult(app_id="x", state=state, exit_code=code, **kw).summary()


def test_creates_a_valid_job_and_its_service_owned_by_it() -> None:
    fake = FakeKube({0: Script(), 1: Script()})
    js, result, _ = run(fake)
    assert [o["kind"] for o in fake.objects] == ["Job", "Service", "NetworkPolicy"]
    job, svc, policy = fake.objects
    assert policy["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # deleted with the Job
    for obj in fake.objects:
        clean = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
        kubernetes_validate.validate(clean, MIN_KUBERNETES_VERSION, strict=True)
    assert svc["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert result.state == "SUCCEEDED" and result.exit_code == 0
    assert [(r.role, r.replica_id) for r in result.replicas] == [("trainer", 0), ("trainer", 1)]


def test_every_line_of_every_pod_reaches_the_callback_in_order() -> None:
    lines = [f"[trainer/0] step {i}" for i in range(9)]
    fake = FakeKube({0: Script(lines=lines), 1: Script(lines=[f"[trainer/2] step {i}" for i in range(5)])})
    _, _, got = run(fake)
    assert [x for x in got if x.startswith("[trainer/0]")] == [f"{line} (pod 0)" for line in lines]
    assert len([x for x in got if x.startswith("[trainer/2]")]) == 5
    assert not any(x[:4].isdigit() for x in got)  # the API's timestamps are stripped


@pytest.mark.parametrize("drop_after", [1, 2, 5, 8])
def test_a_dropped_stream_is_reattached_without_losing_or_repeating_a_line(drop_after: int) -> None:
    lines = [f"[trainer/0] line {i}" for i in range(10)]
    fake = FakeKube({0: Script(lines=lines)}, polls=20, drop_after=drop_after)
    _, _, got = run(fake, replicas=1)
    assert got == [f"{line} (pod 0)" for line in lines]
    assert any("since_seconds" in call for call in fake.log_calls)  # it did reattach


def test_a_replaced_pods_lines_are_followed_too_and_its_result_wins() -> None:
    ok = summary(restarts=1, outputs={"loss": 0.1})
    fake = FakeKube({0: Script(codes=[137, 0], lines=["[trainer/0] hi"], messages=[None, ok]), 1: Script()})
    _, result, got = run(fake)
    assert "[trainer/0] hi (pod 0)" in got and "[trainer/0] hi (pod 1)" in got
    assert result.state == "SUCCEEDED"  # the Job's own condition: the replaced index succeeded
    assert result.replicas[0].exit_code == 0 and result.outputs == {"loss": 0.1} and result.restarts == 1


def test_results_are_merged_from_the_agents_summaries() -> None:
    from torchstep.result import RankResult

    root = RankResult("trainer", 3, 1, state="FAILED", exit_code=1, message="disk full", timestamp=5.0)
    fake = FakeKube(
        {
            0: Script(messages=[summary(outputs={"acc": 0.9})]),
            1: Script(codes=[1], messages=[summary("FAILED", 1, root_cause=root)]),
        }
    )
    _, result, _ = run(fake)
    assert result.state == "FAILED" and result.exit_code == 1 and result.retryable
    assert result.outputs == {"acc": 0.9}  # replica 0 holds global rank 0
    assert result.root_cause is not None and result.root_cause.message == "disk full"
    assert result.message.startswith("trainer replica 1 exited 1")


def test_a_non_retryable_exit_is_not_retryable_and_failed_pods_can_be_kept() -> None:
    fake = FakeKube({0: Script(), 1: Script(codes=[82])})
    _, result, _ = run(fake, on_finish="delete_succeeded")
    assert result.state == "FAILED" and result.exit_code == 82 and result.retryable is False
    assert "(non-retryable)" in result.message
    assert fake.deleted == []  # failed: kept for inspection


def test_success_deletes_everything_with_foreground_propagation() -> None:
    fake = FakeKube({0: Script()})
    js, _, _ = run(fake, replicas=1)
    sel = f"{LABEL_APP_ID}={js.rendered.app_id}"
    assert ("jobs", sel, "Foreground") in fake.deleted and ("pods", sel, "Foreground") in fake.deleted


def test_cancel_from_another_thread_deletes_everything_even_when_keeping() -> None:
    fake = FakeKube({0: Script(), 1: Script()}, polls=10**6)  # never finishes by itself
    js = JobGang(rendered(), fake, on_line=lambda _: None, poll_interval=0.01, on_finish="keep")
    threading.Timer(0.3, js.cancel).start()
    t0 = time.monotonic()
    result = js.run()
    assert time.monotonic() - t0 < 15
    assert result.state == "CANCELLED" and result.retryable is False
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods", "service"}


def test_an_api_error_while_waiting_deletes_everything_and_propagates() -> None:
    fake = FakeKube({0: Script()}, polls=10**6)
    fake.fail_status_reads = 1
    js = JobGang(rendered(2), fake, on_line=lambda _: None, poll_interval=0.01)
    with pytest.raises(RuntimeError, match="500"):
        js.run()
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_bad_on_finish_is_a_spec_error() -> None:
    with pytest.raises(torchstep.SpecError) as err:
        JobGang(rendered(), FakeKube(), on_finish="sometimes")
    assert err.value.field == "on_finish"


def test_a_failing_line_callback_does_not_end_the_stream() -> None:
    seen: list[str] = []

    def flaky(text: str) -> None:
        seen.append(text)
        if len(seen) == 1:
            raise ValueError("logger broke")

    fake = FakeKube({0: Script(lines=["a", "b", "c"])})
    JobGang(rendered(1), fake, on_line=flaky, poll_interval=0.01).run()
    assert seen == ["a (pod 0)", "b (pod 0)", "c (pod 0)"]


@pytest.mark.parametrize("node_ahead_s", [-3600, -120, 0, 9, 30, 120, 3600])
@pytest.mark.parametrize("drop_after", [1, 5])
def test_a_reattached_stream_loses_no_line_when_the_nodes_clock_differs_from_the_watchers(
    node_ahead_s: int, drop_after: int
) -> None:
    """since_seconds is measured on the watcher's clock and applied on the node's: a node
    clock ahead by more than the margin would cut the window after the last line seen."""
    lines = [f"[trainer/0] line {i}" for i in range(10)]
    fake = FakeKube({0: Script(lines=lines)}, polls=20, drop_after=drop_after, clock_offset=node_ahead_s)
    _, _, got = run(fake, replicas=1)
    assert got == [f"{line} (pod 0)" for line in lines]
    assert any("since_seconds" in call for call in fake.log_calls)  # it did reattach with a window


def test_a_replacement_created_in_its_predecessors_second_is_the_latest() -> None:
    """creationTimestamp has whole seconds: the pod that finished last (or still runs) wins."""
    from types import SimpleNamespace as ns

    from torchstep.kubernetes.collect import COMPLETION_INDEX

    def pod(name: str, phase: str, code: int | None, finished: str | None, message: str | None = None):
        term = None if code is None else ns(exit_code=code, message=message, finished_at=finished)
        return ns(
            metadata=ns(
                name=name,
                labels=dict(rendered(2).roles[0].workload["spec"]["template"]["metadata"]["labels"]),
                annotations={COMPLETION_INDEX: "0"},
                creation_timestamp="2026-11-24T00:00:05Z",
                owner_references=[ns(kind="Job", uid="uid-job", controller=True)],
            ),
            status=ns(phase=phase, conditions=[], container_statuses=[ns(name="main", state=ns(terminated=term))]),
        )

    ok = summary(outputs={"loss": 0.1})
    cases = [  # listed newest first: the API's order is not a time order
        [pod("p-b", "Succeeded", 0, "2026-11-24T00:00:09Z", ok), pod("p-a", "Failed", 137, "2026-11-24T00:00:06Z")],
        [pod("p-b", "Succeeded", 0, "2026-11-24T00:00:06Z", ok), pod("p-a", "Failed", 137, "2026-11-24T00:00:06Z")],
        [pod("p-b", "Running", None, None), pod("p-a", "Failed", 137, "2026-11-24T00:00:06Z")],
    ]
    for pods in cases:

        class Listing(FakeKube):
            def list_namespaced_pod(self, namespace: str, label_selector: str):
                return ns(items=pods)

        js = JobGang(rendered(2), Listing(), poll_interval=0.01)
        js.owners.add("Job", rendered(2).roles[0].name, "uid-job")  # as create() does
        result = js.collect("SUCCEEDED", time.time())
        assert result.replicas[0].exit_code != 137, pods[0].status.phase
        if pods[0].status.phase == "Succeeded":
            assert result.outputs == {"loss": 0.1}


def test_a_creation_the_api_server_refuses_is_a_run_error_that_names_the_object_and_the_fix(monkeypatch) -> None:
    """Not a SpecError (the input is fine) and not the client's raw error: one line with the
    HTTP status, the server's message and the fix; retryable (a quota may let a retry in)."""
    from kubefake import ApiError

    fake = FakeKube()
    refused = ApiError(403, "Forbidden")
    refused.body = '{"kind": "Status", "message": "jobs.batch is forbidden: User \\"ml:runner\\" cannot create"}'

    def create(namespace, body):
        raise refused

    monkeypatch.setattr(fake, "create_namespaced_job", create)
    js = JobGang(rendered(), fake, poll_interval=0.01)
    with pytest.raises(torchstep.RunError) as err:
        js.run()
    text = str(err.value)
    assert err.value.what == f"Job ml/{js.rendered.roles[0].name}" and err.value.retryable is True
    assert "(HTTP 403 Forbidden: jobs.batch is forbidden: User" in text
    assert "fix: let the step's identity create jobs in namespace ml (RBAC)" in text
    assert err.value.__cause__ is refused and not isinstance(err.value, torchstep.SpecError)
