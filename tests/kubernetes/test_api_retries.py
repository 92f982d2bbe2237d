"""Transient Kubernetes API errors (429, 5xx, a dropped connection) while a step runs are
retried with backoff within a bounded budget (torchstep.kubernetes.retry), instead of
failing the step and deleting its whole gang of pods; a create is retried only on 429.
Against the recorded fake (tests/kubefake.py) and, with the official client over HTTP,
the cross-process fake (tests/kubehttp.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubefake import ApiError, FakeKube, Script
from proclib import wait_for
from torchstep.errors import RunError
from torchstep.kubernetes import JobGang, render_app
from torchstep.kubernetes.retry import ApiRetriesExhausted
from torchx import specs


class Busy(ApiError):
    """An API error with the response's headers, as the official ``ApiException`` has them."""

    def __init__(self, status: int, retry_after: float | None = None) -> None:
        super().__init__(status, "Too Many Requests" if status == 429 else "Internal Server Error")
        self.headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}


class Flaky(FakeKube):
    """The recorded fake, whose calls named in ``errors`` raise the queued errors first
    (``always``: raise that error on every call of that name); ``calls`` records each call's
    name and monotonic time."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.errors: dict[str, list[BaseException]] = {}
        self.always: dict[str, BaseException] = {}
        self.calls: list[tuple[str, float]] = []

    def _maybe_fail(self, name: str) -> None:
        self.calls.append((name, time.monotonic()))
        if name in self.always:
            raise self.always[name]
        queued = self.errors.get(name)
        if queued:
            raise queued.pop(0)

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        self._maybe_fail("read_namespaced_job_status")
        return super().read_namespaced_job_status(name, namespace)

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        self._maybe_fail("list_namespaced_pod")
        return super().list_namespaced_pod(namespace, label_selector)

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self._maybe_fail("read_namespaced_pod_log")
        return super().read_namespaced_pod_log(name, namespace, **kwargs)

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self._maybe_fail("create_namespaced_job")
        return super().create_namespaced_job(namespace, body)

    def delete_collection_namespaced_job(self, namespace: str, label_selector: str, **kw: Any):
        self._maybe_fail("delete_collection_namespaced_job")
        return super().delete_collection_namespaced_job(namespace, label_selector, **kw)

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.calls if n == name)


def rendered(replicas: int = 2):
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        metadata={"torchstep": {"nproc_per_node": 1}},
    )
    return render_app(specs.AppDef("train", roles=[role]), namespace="ml", cfg={"run_id": "run-42"})


def gang(fake: FakeKube, budget_s: float = 30.0, **kw: Any) -> tuple[JobGang, list[str]]:
    lines: list[str] = []
    kw.setdefault("poll_interval", 0.01)
    js = JobGang(rendered(), fake, on_line=lines.append, **kw)
    js.api_retry_budget_s = budget_s
    return js, lines


def scripts() -> dict[int, Script]:
    return {i: Script(lines=[f"[trainer/{i}] step {k}" for k in range(4)]) for i in (0, 1)}


@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_one_transient_error_on_a_status_read_is_retried_and_the_step_succeeds(status: int) -> None:
    fake = Flaky(scripts(), polls=3)
    fake.errors["read_namespaced_job_status"] = [Busy(status)]
    js, lines = gang(fake)
    result = js.run()
    assert result.state == "SUCCEEDED" and result.exit_code == 0
    assert [r.replica_id for r in result.replicas] == [0, 1]
    # deleted once, at the end: after the Job completed (not when the error came)
    assert [kind for kind, _, _ in fake.deleted].count("jobs") == 1
    assert sorted(x for x in lines if x.startswith("[trainer/")) == sorted(
        f"[trainer/{i}] step {k} (pod 0)" for i in (0, 1) for k in range(4)
    )


def test_transient_errors_listing_pods_and_a_dropped_connection_are_retried() -> None:
    fake = Flaky(scripts(), polls=3)
    fake.errors["list_namespaced_pod"] = [Busy(500), ConnectionResetError("reset by peer"), Busy(503)]
    js, lines = gang(fake)
    result = js.run()
    assert result.state == "SUCCEEDED"
    assert fake.count("list_namespaced_pod") >= 4
    assert len([x for x in lines if x.startswith("[trainer/")]) == 8


def test_a_persistent_500_fails_the_step_within_the_budget_naming_the_call_and_deletes_everything() -> None:
    fake = Flaky(scripts(), polls=10**6)
    fake.always["read_namespaced_job_status"] = Busy(500)
    js, _ = gang(fake, budget_s=1.5)
    t0 = time.monotonic()
    with pytest.raises(RunError) as err:
        js.run()
    took = time.monotonic() - t0
    assert isinstance(err.value, ApiRetriesExhausted) and err.value.retryable
    assert err.value.status == 500
    assert f"read Job ml/{js.rendered.roles[0].name}" in str(err.value) and "HTTP 500" in str(err.value)
    assert 0.5 < took < 15
    assert 3 <= fake.count("read_namespaced_job_status") <= 20  # backoff, not a busy loop
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_a_429_waits_what_retry_after_says() -> None:
    fake = Flaky(scripts(), polls=3)
    fake.errors["read_namespaced_job_status"] = [Busy(429, retry_after=1)]
    js, _ = gang(fake)
    assert js.run().state == "SUCCEEDED"
    reads = [t for n, t in fake.calls if n == "read_namespaced_job_status"]
    assert reads[1] - reads[0] >= 0.95  # told 1 s: not the 0.2 s backoff


def test_errors_that_are_not_transient_are_not_retried() -> None:
    fake = Flaky(scripts(), polls=10**6)
    fake.errors["read_namespaced_job_status"] = [Busy(403)]
    js, _ = gang(fake)
    with pytest.raises(ApiError) as err:
        js.run()
    assert err.value.status == 403 and fake.count("read_namespaced_job_status") == 1


def test_a_create_answered_500_is_not_retried_blindly() -> None:
    fake = Flaky(scripts())
    fake.errors["create_namespaced_job"] = [Busy(500)]
    js, _ = gang(fake)
    with pytest.raises(RunError, match="HTTP 500"):
        js.run()
    assert fake.count("create_namespaced_job") == 1 and not fake.objects  # the server may have made it: no 2nd try


def test_a_create_answered_429_is_retried_and_makes_one_job() -> None:
    fake = Flaky(scripts(), polls=3)
    fake.errors["create_namespaced_job"] = [Busy(429, retry_after=0)]
    js, _ = gang(fake)
    assert js.run().state == "SUCCEEDED"
    assert fake.count("create_namespaced_job") == 2 and [o["kind"] for o in fake.objects].count("Job") == 1
    assert fake.conflicts == 0


def test_a_cancel_while_waiting_to_retry_ends_the_run_cancelled_at_once() -> None:
    fake = Flaky(scripts(), polls=10**6)
    fake.always["read_namespaced_job_status"] = Busy(429, retry_after=20)
    js, _ = gang(fake, budget_s=120)
    threading.Timer(0.5, js.cancel).start()
    t0 = time.monotonic()
    result = js.run()
    assert result.state == "CANCELLED" and time.monotonic() - t0 < 10
    assert result.exit_code == 143  # its agents are SIGTERMed, as on the local target (was None)
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_a_transient_error_on_a_delete_is_retried_so_nothing_is_left() -> None:
    fake = Flaky(scripts(), polls=3)
    fake.errors["delete_collection_namespaced_job"] = [Busy(503)]
    js, _ = gang(fake)
    assert js.run().state == "SUCCEEDED"
    assert (
        fake.count("delete_collection_namespaced_job") == 2
        and ("jobs", js.rendered.label_selector, "Foreground") in fake.deleted
    )


def test_a_finished_pods_log_that_fails_to_read_is_read_again() -> None:
    """Every pod has finished when it is first followed (polls=0): a 500 on that one read
    of its log used to end the follower, and the pod's lines were never shown."""
    fake = Flaky(scripts(), polls=0)
    fake.errors["read_namespaced_pod_log"] = [Busy(500), Busy(500)]
    js, lines = gang(fake)
    assert js.run().state == "SUCCEEDED"
    assert sorted(x for x in lines if x.startswith("[trainer/")) == sorted(
        f"[trainer/{i}] step {k} (pod 0)" for i in (0, 1) for k in range(4)
    )


# -- the official client over HTTP (tests/kubehttp.py) -----------------------------------------------
kubehttp = pytest.importorskip("kubehttp")
pytest.importorskip("kubernetes")


@pytest.fixture
def server(tmp_path: Path):
    s = kubehttp.start_server(tmp_path / "api", kubehttp.Scenario(replicas=2, run_s=3, lines=20, line_interval_s=0.1))
    yield s
    s.stop()


def official(server) -> Any:
    from torchstep.kubernetes import OfficialClient

    return OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)


def test_a_burst_of_500s_and_429s_over_http_is_ridden_out(server) -> None:
    js, lines = gang(official(server), poll_interval=0.2)
    done: dict[str, Any] = {}
    t = threading.Thread(target=lambda: done.setdefault("result", js.run()))
    t.start()
    time.sleep(1.0)  # running: every request for a while is answered 500, then 429 with Retry-After
    server.fault(status=500, count=6)
    wait_for(lambda: server.state()["faults_answered"] == 6, 60, "the 500s to be answered")
    server.fault(status=429, count=4, retry_after=1)
    t.join(120)
    assert done["result"].state == "SUCCEEDED"
    state = server.state()
    assert state["faults_answered"] == 10 and state["jobs_created"] == 1
    assert not [o for o in state["objects"] if o["labels"].get("torchstep/app-id")]  # deleted at the end
    assert sorted(x for x in lines if x.startswith("[trainer/")) == sorted(
        f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(20)
    )


def test_a_500_on_a_pod_status_read_does_not_stop_following_a_running_pod(server) -> None:
    """The log follower asks whether its pod ended before each stream: a 500 there used to
    count as "ended", the pod's log was read once and the follower stopped for good."""
    js, lines = gang(official(server), poll_interval=0.2)
    done: dict[str, Any] = {}
    t = threading.Thread(target=lambda: done.setdefault("result", js.run()))
    t.start()
    time.sleep(1.0)
    server.fault(cut_logs=2)  # both followers reattach: each reads its pod's status first...
    server.fault(status=500, count=2, match="/pods/", methods=["GET"])  # ...and is answered 500
    t.join(120)
    assert done["result"].state == "SUCCEEDED"
    assert server.state()["streams_cut"] == 2
    assert sorted(x for x in lines if x.startswith("[trainer/")) == sorted(
        f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(20)
    )


def test_the_default_client_reads_kubeconfig_as_it_is_when_made(server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubernetes package reads $KUBECONFIG once, when first imported: a long-lived process
    (a Prefect or Airflow worker, a test run) that sets it later must still get that cluster,
    not ~/.kube/config (a CI failure of the real-pod Prefect tests)."""
    import kubernetes.config  # imported before the variable is set, as in a worker
    from torchstep.kubernetes import OfficialClient

    monkeypatch.setenv("HOME", str(server.kubeconfig.parent))  # no ~/.kube/config to fall back on
    monkeypatch.setenv("KUBECONFIG", str(server.kubeconfig))
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", "~/.kube/config")
    client = OfficialClient.from_config(in_cluster=False)
    assert client.list_namespaced_pod("ml", label_selector="").items == []  # it reached this server
