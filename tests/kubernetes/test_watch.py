"""The watcher follows a run through the Kubernetes watch API (issue 34, item 5), against the
fake API server over HTTP with the official client (tests/kubehttp.py, tests/apiwatch.py):
events instead of reads of each object, an eviction gone at once still counted, a watch cut
mid-run resumed from its resourceVersion without losing the change it was about to carry,
410 Gone listed again, a cancel that ends the watches at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubehttp import KubeServer, Scenario, start_server
from proclib import wait_for
from torchstep.kubernetes import JobGang, render_app
from torchx import specs

pytest.importorskip("kubernetes")

LINES = 20


def rendered(replicas: int = 2) -> Any:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        max_retries=2,
        retry_policy=specs.RetryPolicy.REPLICA,
    )
    return render_app(specs.AppDef("train", roles=[role]), namespace="ml", cfg={"run_id": "run-w"})


@pytest.fixture
def server(tmp_path: Path):
    s = start_server(tmp_path / "api", Scenario(replicas=2, run_s=4, lines=LINES, line_interval_s=0.2))
    yield s
    s.stop()


def start(server: KubeServer, **kw: Any) -> tuple[JobGang, list[str], dict[str, Any], threading.Thread]:
    """JobGang.run in a thread, over the official client; ``poll_interval`` 30 s: a watcher
    that still polled would see nothing of a 4 s run in time."""
    from torchstep.kubernetes import OfficialClient

    kube = OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)
    lines: list[str] = []
    gang = JobGang(rendered(), kube, on_line=lines.append, poll_interval=30.0, **kw)
    done: dict[str, Any] = {}
    t = threading.Thread(target=lambda: done.setdefault("result", gang.run()), daemon=True)
    t.start()
    return gang, lines, done, t


def running(server: KubeServer) -> bool:
    return server.state()["watch_requests"] >= 2 and any(o["kind"] == "Pod" for o in server.state()["objects"])


def every_line(lines: list[str]) -> list[str]:
    return sorted(x for x in lines if x.startswith("[trainer/"))


def test_the_run_is_followed_by_events_not_by_reading_each_object(server: KubeServer) -> None:
    gang, lines, done, t = start(server)
    t.join(60)
    assert done["result"].state == "SUCCEEDED", done["result"].summary()
    state = server.state()
    assert state["watch_requests"] >= 2  # the run's Pods and its Job
    assert state.get("reads_job", 0) == 0  # the Job's completion came as an event
    assert state["lists"] <= 6  # one list per watch, then the pods once more for the last lines and the result
    assert every_line(lines) == sorted(f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(LINES))
    assert [w.kind for w in gang.watchers] == ["Pod", "Job"] and all(w.relists == 0 for w in gang.watchers)


def test_an_evicted_pod_deleted_at_once_is_counted_as_a_preemption(server: KubeServer) -> None:
    """Its DisruptionTarget condition and its deletion happen together: no read in between
    (the poll would see only the Job controller's replacement); the watch's events carry it."""
    gang, lines, done, t = start(server)
    wait_for(lambda: running(server), 60, "the run's pods and watches")
    evicted = server.fault(evict_pod=1)["pod"]
    assert evicted is not None
    t.join(60)
    result = done["result"]
    assert result.state == "SUCCEEDED", result.summary()
    said = [x for x in lines if "was preempted" in x]
    assert len(said) == 1 and evicted in said[0] and "EvictionByEvictionAPI" in said[0], lines
    assert any(w.startswith("preempted 1 time (1 pod(s) with DisruptionTarget") for w in result.warnings)
    assert server.state()["pods_replaced"] == 1


def test_a_watch_cut_mid_run_resumes_without_losing_the_change_it_carried(server: KubeServer) -> None:
    gang, lines, done, t = start(server)
    wait_for(lambda: running(server), 60, "the run's pods and watches")
    # both watches are reset just as they are about to send the pods' and the Job's completion,
    # and their first reconnections are answered 500: resumed after a backoff, from their version
    server.fault(cut_watches=2)
    server.fault(status=500, count=2, match="watch=")
    t.join(50)  # a lost completion would leave the run waiting for good
    assert "result" in done, "the run never saw its pods finish"
    assert done["result"].state == "SUCCEEDED", done["result"].summary()
    state = server.state()
    assert state["watches_cut"] == 2 and state["faults_answered"] == 2
    assert state["watches_expired"] == 0 and all(w.relists == 0 for w in gang.watchers)
    assert sum(w.reconnects for w in gang.watchers) >= 2
    assert every_line(lines) == sorted(f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(LINES))


def test_a_watch_whose_version_expired_lists_again(server: KubeServer) -> None:
    gang, lines, done, t = start(server)
    wait_for(lambda: running(server), 60, "the run's pods and watches")
    # evicted once its log is followed: a pod deleted before anyone read its log takes the
    # lines it wrote with it, on a real cluster as here (a loaded machine can delay the follower)
    wait_for(lambda: "[trainer/0] line 0" in lines, 60, "pod 0's log followed")
    # the pods' watch is reset as it is about to send the eviction, and every version up to
    # then is compacted away as it is: its reconnection is answered 410 Gone
    server.fault(cut_watches=1, expire=True, evict_pod=0)
    t.join(60)
    result = done["result"]
    assert result.state == "SUCCEEDED", result.summary()
    state = server.state()
    assert state["watches_expired"] >= 1
    assert sum(w.relists for w in gang.watchers) >= 1
    # no line lost (the replacement repeats the last line its predecessor wrote: it resumes there)
    assert set(every_line(lines)) == {f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(LINES)}


def test_a_cancel_returns_at_once_and_closes_the_watches(tmp_path: Path) -> None:
    server = start_server(tmp_path / "api", Scenario(replicas=2, run_s=600, lines=LINES, line_interval_s=0.2))
    try:
        gang, _, done, t = start(server)
        wait_for(lambda: running(server), 60, "the run's pods and watches")
        t0 = time.monotonic()
        gang.cancel()
        t.join(30)
        took = time.monotonic() - t0
        assert done["result"].state == "CANCELLED"
        assert took < 25  # the watch timeout (60 s) is not waited for
        for w in gang.watchers:
            w.join(10)
            assert not w.alive
        assert not [o for o in server.state()["objects"] if o["labels"].get("torchstep/app-id")]
    finally:
        server.stop()
