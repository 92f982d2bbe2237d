"""A watcher that dies does not start a second Job: real processes, the official Kubernetes
client, and the cross-process fake API of tests/kubehttp.py. A watcher process runs a
2-replica step through ``torchstep.steps.KubernetesStep``; the test SIGKILLs it while the
Job runs and runs the same step (same run id) again in a new process, as an orchestrator's
retry does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubehttp import KubeServer, Scenario, start_server
from proclib import wait_for
from torchstep.result import StepResult

pytest.importorskip("kubernetes")

WATCHER = r"""
import json, os, signal, sys
import torchstep
from torchstep.kubernetes import OfficialClient
from torchstep.steps import KubernetesStep
from torchx import specs

kubeconfig, out, result_file = sys.argv[1:4]
store_file = sys.argv[4] if len(sys.argv) > 4 else None


class FileStore:  # an orchestrator's state between tries (Airflow's task state store), in a JSON file

    def get(self, key, default=None):
        try:
            return json.load(open(store_file)).get(key, default)
        except FileNotFoundError:
            return default

    def set(self, key, value):
        data = json.load(open(store_file)) if os.path.exists(store_file) else {}
        data[key] = value
        open(store_file + ".tmp", "w").write(json.dumps(data))
        os.replace(store_file + ".tmp", store_file)


role = specs.Role("trainer", image="ghcr.io/acme/train:1", entrypoint="python", args=["-m", "train"],
                  num_replicas=2, metadata={"torchstep": {"nproc_per_node": 1}})
plan = torchstep.build_plan(specs.AppDef("train", roles=[role]), target="kubernetes")
kube = OfficialClient.from_config(config_file=kubeconfig, in_cluster=False)
sink = open(out, "a", buffering=1)
step = KubernetesStep(plan, run_id="durable-1", cfg={"namespace": "ml"}, client=kube,
                      on_line=lambda line: (sink.write(line + "\n"), sink.flush()), poll_interval=0.2,
                      cursor_store=FileStore() if store_file else None)
step.job_gang().cursor_interval = 0.5

def stop(signum, frame):
    raise KeyboardInterrupt  # the orchestrator cancels the step
signal.signal(signal.SIGTERM, stop)
try:
    result = step.run()
except torchstep.SpecError as e:
    open(result_file, "w").write(json.dumps({"error": str(e)}))
    sys.exit(2)
except KeyboardInterrupt:
    open(result_file, "w").write(json.dumps({"cancelled": True, "attached": step.attached}))
    sys.exit(143)
open(result_file, "w").write(json.dumps({**result.to_dict(), "attached": step.attached}))
"""


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    script = tmp_path / "watcher.py"
    script.write_text(WATCHER)
    procs: list[subprocess.Popen[bytes]] = []

    def start(server: KubeServer, name: str, store: Path | None = None) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(server.kubeconfig),
                str(tmp_path / f"{name}.log"),
                str(tmp_path / f"{name}.json"),
                *([str(store)] if store else []),
            ],
            stderr=open(tmp_path / f"{name}.err", "wb"),
        )
        procs.append(proc)
        return proc

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.fixture
def server_for(tmp_path: Path) -> Iterator[Callable[[Scenario], KubeServer]]:
    servers: list[KubeServer] = []

    def start(scenario: Scenario) -> KubeServer:
        servers.append(start_server(tmp_path / f"api{len(servers)}", scenario))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def cursor_saved(server: KubeServer) -> bool:
    return any("torchstep/log-cursor" in o["annotations"] for o in server.state()["objects"] if o["kind"] == "Job")


def ok(index: int) -> str:
    return StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.25 + index}).summary()


def test_a_sigkilled_watcher_run_again_attaches_and_its_logs_continue(server_for, watcher, tmp_path: Path) -> None:
    server = server_for(Scenario(replicas=2, run_s=8, lines=40, line_interval_s=0.15, messages=[ok(0), ok(1)]))
    first = watcher(server, "first")
    wait_for(
        lambda: len(lines_of(tmp_path / "first.log")) >= 16 and cursor_saved(server),
        90,
        "the first watcher to stream and save its log position",
    )
    first.send_signal(signal.SIGKILL)
    first.wait()
    seen_first = lines_of(tmp_path / "first.log")
    second = watcher(server, "second")
    assert second.wait(120) == 0, (tmp_path / "second.err").read_text()[-3000:]
    result = json.loads((tmp_path / "second.json").read_text())
    assert result["attached"] is True and result["state"] == "SUCCEEDED"
    assert [r["replica_id"] for r in result["replicas"]] == [0, 1] and result["outputs"] == {"loss": 0.25}
    state = server.state()
    assert state["jobs_created"] == 1 and state["conflicts"] >= 1  # one gang of pods, ever
    seen_second = lines_of(tmp_path / "second.log")
    for index in (0, 1):
        everything = [f"[trainer/{index}] line {k}" for k in range(40)]
        first_part = [x for x in seen_first if x.startswith(f"[trainer/{index}]")]
        second_part = [x for x in seen_second if x.startswith(f"[trainer/{index}]")]
        assert set(first_part) | set(second_part) == set(everything)  # no line lost
        assert second_part == everything[everything.index(second_part[0]) :]  # a contiguous tail, in order
        assert second_part[0] != everything[0]  # continued after the saved cursor, not from the start
        repeated = set(first_part) & set(second_part)
        assert len(repeated) <= 12  # only what came after the last save (0.5 s + the kill)
    # the run that finished cleaned up everything it created
    assert not [o for o in state["objects"] if o["labels"].get("torchstep/app-id")]


def test_a_job_that_finished_while_nobody_watched_returns_its_result_without_a_rerun(
    server_for, watcher, tmp_path: Path
) -> None:
    server = server_for(Scenario(replicas=2, run_s=2, lines=5, line_interval_s=0.1, messages=[ok(0), ok(1)]))
    first = watcher(server, "first")
    wait_for(lambda: server.state()["jobs_created"] == 1, 90, "the Job to be created")
    first.send_signal(signal.SIGKILL)
    first.wait()
    time.sleep(2.5)  # the pods run to their end while nobody watches
    second = watcher(server, "second")
    assert second.wait(120) == 0, (tmp_path / "second.err").read_text()[-3000:]
    result = json.loads((tmp_path / "second.json").read_text())
    assert result["attached"] is True and result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.25}
    assert server.state()["jobs_created"] == 1
    seen = set(lines_of(tmp_path / "first.log")) | set(lines_of(tmp_path / "second.log"))
    assert seen == {f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(5)}  # the rest of the log is shown


def test_a_job_of_the_same_name_created_by_someone_else_is_refused_and_left_alone(
    server_for, watcher, tmp_path: Path
) -> None:
    import torchstep
    from torchstep.kubernetes import OfficialClient, render_app
    from torchx import specs

    server = server_for(Scenario(replicas=2, run_s=30))
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=2,
        metadata={"torchstep": {"nproc_per_node": 1}},
    )
    plan = torchstep.build_plan(specs.AppDef("train", roles=[role]), target="kubernetes")
    foreign = render_app(plan, cfg={"run_id": "durable-1", "namespace": "ml"}).roles[0].workload
    foreign["metadata"]["labels"] = {"team": "other"}
    OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False).create_namespaced_job(
        "ml", body=foreign
    )
    proc = watcher(server, "first")
    assert proc.wait(120) == 2
    error = json.loads((tmp_path / "first.json").read_text())["error"]
    assert f"Job ml/{foreign['metadata']['name']}" in error and "not created by this run" in error
    state = server.state()
    assert [o["name"] for o in state["objects"] if o["kind"] == "Job"] == [foreign["metadata"]["name"]]
    assert state["jobs_created"] == 1 and not [d for d in state["deleted"] if d.startswith("Job/")]


def test_cancelling_a_reattached_watcher_deletes_the_job_and_its_pods(server_for, watcher, tmp_path: Path) -> None:
    server = server_for(Scenario(replicas=2, run_s=120, lines=1000, line_interval_s=0.1))
    first = watcher(server, "first")
    wait_for(lambda: len(lines_of(tmp_path / "first.log")) >= 4, 90, "lines from the first watcher")
    first.send_signal(signal.SIGKILL)
    first.wait()
    before = len(lines_of(tmp_path / "first.log"))
    second = watcher(server, "second")
    wait_for(lambda: len(lines_of(tmp_path / "second.log")) >= 4, 90, "the second watcher to attach and stream")
    second.send_signal(signal.SIGTERM)  # the orchestrator cancels the run
    assert second.wait(120) == 143
    assert json.loads((tmp_path / "second.json").read_text()) == {"cancelled": True, "attached": True}
    state = server.state()
    assert state["jobs_created"] == 1 and before >= 4
    assert not [o for o in state["objects"] if o["labels"].get("torchstep/app-id")]  # Job, pods, Service: gone
    assert any(d.startswith("Job/") for d in state["deleted"]) and any(d.startswith("Pod/") for d in state["deleted"])


def test_the_fake_api_answers_the_official_client_as_the_api_server_does(server_for) -> None:
    from kubernetes.client.exceptions import ApiException
    from torchstep.kubernetes import OfficialClient

    server = server_for(Scenario(replicas=1, run_s=1, lines=3, line_interval_s=0.1))
    kube = OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "labels": {"a": "b"}},
        "spec": {"containers": [{"name": "main", "image": "x"}]},
    }
    kube.create_namespaced_pod("ml", body=body)
    with pytest.raises(ApiException) as err:
        kube.create_namespaced_pod("ml", body=body)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        kube.read_namespaced_pod_status("nope", "ml")
    assert err.value.status == 404
    kube.patch_namespaced_pod("p", "ml", body={"metadata": {"annotations": {"k": "v"}}})
    assert kube.read_namespaced_pod_status("p", "ml").metadata.annotations == {"k": "v"}
    stream = kube.read_namespaced_pod_log(
        "p", "ml", container="main", follow=True, timestamps=True, _preload_content=False
    )
    text = b"".join(stream.stream()).decode()
    assert [line.split(" ", 1)[1] for line in text.splitlines()] == [f"[role/0] line {k}" for k in range(3)]
    assert kube.read_namespaced_pod_status("p", "ml").status.phase == "Succeeded"
    assert [p.metadata.name for p in kube.list_namespaced_pod("ml", label_selector="a=b").items] == ["p"]
    kube.delete_collection_namespaced_pod("ml", label_selector="a=b")
    assert kube.list_namespaced_pod("ml", label_selector="a=b").items == []
    assert os.stat(server.kubeconfig).st_mode & 0o777 == 0o600


def _plan():
    import torchstep
    from torchx import specs

    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=2,
        metadata={"torchstep": {"nproc_per_node": 1}},
    )
    return torchstep.build_plan(specs.AppDef("train", roles=[role]), target="kubernetes")


def test_a_forged_pod_with_replica_0s_labels_changes_neither_the_result_nor_the_log(
    server_for, watcher, tmp_path: Path
) -> None:
    """Created through the API before the step runs, with replica 0's labels (predictable
    from the run id), its own log lines and a forged result as termination message."""
    from torchstep.kubernetes import OfficialClient, render_app

    server = server_for(Scenario(replicas=2, run_s=2, lines=5, line_interval_s=0.1, messages=[ok(0), ok(1)]))
    kube = OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)
    job = render_app(_plan(), cfg={"run_id": "durable-1", "namespace": "ml"}).roles[0].workload
    forged_result = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": -1.0}).summary()
    kube.create_namespaced_pod(
        "ml",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "evil",
                "labels": job["spec"]["template"]["metadata"]["labels"],
                "annotations": {
                    "batch.kubernetes.io/job-completion-index": "0",
                    "kubehttp/message": forged_result,
                    "kubehttp/line": "[trainer/0] FORGED",
                },
            },
            "spec": {"containers": [{"name": "main", "image": "x"}]},
        },
    )
    proc = watcher(server, "first")
    assert proc.wait(120) == 0, (tmp_path / "first.err").read_text()[-3000:]
    result = json.loads((tmp_path / "first.json").read_text())
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.25}  # replica 0's own
    lines = lines_of(tmp_path / "first.log")
    assert not [x for x in lines if "FORGED" in x]
    assert {x for x in lines if x.startswith("[trainer/")} == {
        f"[trainer/{i}] line {k}" for i in (0, 1) for k in range(5)
    }
    warned = [x for x in lines if "ignoring pod ml/evil" in x]
    assert len(warned) == 1 and "a bare pod" in warned[0]
    assert server.state()["jobs_created"] == 1


def test_the_fakes_pods_carry_the_job_controllers_owner_reference_in_a_valid_shape(server_for) -> None:
    import kubernetes_validate
    from torchstep.kubernetes import MIN_KUBERNETES_VERSION, OfficialClient, render_app

    server = server_for(Scenario(replicas=2, run_s=30))
    kube = OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)
    rendered = render_app(_plan(), cfg={"run_id": "shape-1", "namespace": "ml"})
    job = kube.create_namespaced_job("ml", body=rendered.roles[0].workload)
    pods = kube.list_namespaced_pod("ml", label_selector=rendered.label_selector).items
    assert len(pods) == 2
    for pod in pods:
        (ref,) = pod.metadata.owner_references
        assert (ref.kind, ref.name, ref.uid, ref.controller) == ("Job", job.metadata.name, job.metadata.uid, True)
        kubernetes_validate.validate(kube.sanitize(pod), MIN_KUBERNETES_VERSION, strict=True)


def test_a_forged_job_with_copied_labels_is_refused_by_name_under_a_state_store(
    server_for, watcher, tmp_path: Path
) -> None:
    from torchstep.kubernetes import OfficialClient, render_app

    server = server_for(Scenario(replicas=2, run_s=30))
    forged = render_app(_plan(), cfg={"run_id": "durable-1", "namespace": "ml"}).roles[0].workload  # labels and all
    OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False).create_namespaced_job(
        "ml", body=forged
    )
    proc = watcher(server, "first", store=tmp_path / "store.json")
    assert proc.wait(120) == 2
    error = json.loads((tmp_path / "first.json").read_text())["error"]
    assert f"Job ml/{forged['metadata']['name']}" in error and "not created by this run" in error
    state = server.state()
    assert state["jobs_created"] == 1 and state["deleted"] == []  # refused by name, nothing deleted
    assert [o["name"] for o in state["objects"] if o["kind"] == "Job"] == [forged["metadata"]["name"]]
    assert not lines_of(tmp_path / "first.log")  # nothing of it was read


def test_a_watcher_with_a_state_store_reattaches_to_the_job_it_created(server_for, watcher, tmp_path: Path) -> None:
    server = server_for(Scenario(replicas=2, run_s=6, lines=30, line_interval_s=0.15, messages=[ok(0), ok(1)]))
    store = tmp_path / "store.json"
    first = watcher(server, "first", store=store)
    wait_for(lambda: store.exists() and "torchstep_workload_uids" in store.read_text(), 90, "the uid to be recorded")
    first.send_signal(signal.SIGKILL)
    first.wait()
    (job,) = [o for o in server.state()["objects"] if o["kind"] == "Job"]
    assert json.loads(store.read_text())["torchstep_workload_uids"] == {job["name"]: job["uid"]}
    second = watcher(server, "second", store=store)
    assert second.wait(120) == 0, (tmp_path / "second.err").read_text()[-3000:]
    result = json.loads((tmp_path / "second.json").read_text())
    assert result["attached"] is True and result["outputs"] == {"loss": 0.25}
    assert server.state()["jobs_created"] == 1
