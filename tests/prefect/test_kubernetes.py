"""Target "kubernetes" of app_task against the recorded Kubernetes fake (no cluster here),
and the Kubernetes work pool: job variables from an AppDef and the base job template that
renders them into a valid Job."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
import asyncio
import hashlib
import json
import uuid

import kubernetes_validate
import pytest
import torchstep
from kubefake import DyingOnce, FakeKube, Script, WatcherDies
from torchstep.components.appjson import app_to_dict
from torchstep.kubernetes import MIN_KUBERNETES_VERSION
from torchstep.result import StepResult
from torchstep.steps import step_run_id
from torchx import specs

pytest.importorskip("prefect")
import prefect.runtime  # noqa: E402
from prefect import flow  # noqa: E402
from prefect.client.orchestration import get_client  # noqa: E402
from torchstep_prefect import StepFailed, app_task, base_job_template, job_variables, tasks  # noqa: E402

pytestmark = pytest.mark.usefixtures("prefect_harness")


def nodes_app(max_retries: int = 2) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=2,
        resource=specs.Resource(cpu=2, gpu=1, memMB=4096),
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={
            "torchstep": {"nproc_per_node": 2, "secret_env": {"HF_TOKEN": "hf/token"}},
            "kubernetes": {"tolerations": [{"key": "gpu", "operator": "Exists"}]},
        },
    )
    return specs.AppDef("nodes", roles=[role])


def strip_uid(obj: dict) -> dict:
    return {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}


def test_a_re_executed_flow_run_attaches_to_the_job_its_dead_process_created(monkeypatch) -> None:
    from prefect.flow_engine import run_flow

    monkeypatch.setattr(tasks, "POLL_INTERVAL_S", 0.01)
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.25}).summary()
    fake = DyingOnce({0: Script(lines=["[trainer/0] step 1"], messages=[ok]), 1: Script(messages=[ok])})
    train = app_task(nodes_app(max_retries=0), target="kubernetes", cfg={"namespace": "ml"}, client=fake)

    runs: list = []

    @flow
    def pipeline():
        runs.append(prefect.runtime.flow_run.id)
        return train()

    with pytest.raises(WatcherDies):
        pipeline()
    assert [o["kind"] for o in fake.objects] == ["Job", "Service", "NetworkPolicy"] and not fake.deleted
    with get_client(sync_client=True) as client:
        first = client.read_flow_run(runs[0])
    fake.dead = False  # the flow run's infrastructure runs the same flow run again
    result = run_flow(pipeline, flow_run=first)
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.25}
    assert [o["kind"] for o in fake.objects] == ["Job", "Service", "NetworkPolicy"]  # attached: no second Job
    assert fake.conflicts >= 1
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}  # cleaned up by the run that finished


def test_a_timeout_while_reattached_deletes_the_job_and_its_pods(monkeypatch) -> None:
    from prefect.flow_engine import run_flow

    monkeypatch.setattr(tasks, "POLL_INTERVAL_S", 0.01)
    fake = DyingOnce({0: Script(), 1: Script()}, polls=10**6)  # never finishes by itself
    train = app_task(
        nodes_app(max_retries=0), target="kubernetes", cfg={"namespace": "ml"}, client=fake, timeout_seconds=3
    )

    runs: list = []

    @flow
    def pipeline():
        runs.append(prefect.runtime.flow_run.id)
        return train(return_state=True)

    with pytest.raises(WatcherDies):
        pipeline()
    with get_client(sync_client=True) as client:
        first = client.read_flow_run(runs[0])
    fake.dead = False
    state = run_flow(pipeline, flow_run=first, return_type="state")
    assert state.is_failed()
    assert fake.objects and any(kind == "jobs" for kind, _, _ in fake.deleted)
    assert fake.conflicts >= 1 and sum(o["kind"] == "Job" for o in fake.objects) == 1  # it was attached
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_the_kubernetes_target_submits_what_render_gives_and_returns_the_merged_result(monkeypatch) -> None:
    monkeypatch.setattr(tasks, "POLL_INTERVAL_S", 0.01)
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.5}).summary()
    fake = FakeKube({0: Script(lines=["[trainer/0] step 1"], messages=[ok]), 1: Script()})
    app = nodes_app()
    train = app_task(app, target="kubernetes", cfg={"namespace": "ml"}, client=fake)
    assert train.retries == 2  # APPLICATION: Prefect's retries; the Job's backoffLimit stays the plan's

    @flow
    def pipeline():
        return train(return_state=True)

    state = pipeline()
    result = state.result()
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.5}
    # exactly what torchstep.kubernetes.render gives for this task run's run id
    details = state.state_details
    with get_client(sync_client=True) as client:  # the Jobs are named after the logical task call
        task_run = client.read_task_run(details.task_run_id)
    digest = hashlib.sha256(json.dumps(app_to_dict(app), sort_keys=True, default=str).encode()).hexdigest()[:10]
    run_id = step_run_id("prefect", details.flow_run_id, task_run.task_key, digest, 0)
    expected = torchstep.kubernetes.render(app, namespace="ml", cfg={"run_id": run_id})
    created = {o["kind"]: strip_uid(o) for o in fake.objects}
    for obj in expected:
        got = dict(created[obj["kind"]])
        if obj["kind"] in ("Service", "NetworkPolicy"):  # the one field set on creation: the Job owns them
            got["metadata"] = {k: v for k, v in got["metadata"].items() if k != "ownerReferences"}
        assert got == obj
    job = created["Job"]
    assert job["spec"]["backoffLimit"] == 0
    for obj in fake.objects:
        kubernetes_validate.validate(strip_uid(obj), MIN_KUBERNETES_VERSION, strict=True)
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_a_failed_job_fails_the_task_with_the_root_cause(monkeypatch) -> None:
    monkeypatch.setattr(tasks, "POLL_INTERVAL_S", 0.01)
    bad = StepResult(app_id="x", state="FAILED", exit_code=82, retryable=False, message="bad input").summary()
    fake = FakeKube({0: Script(codes=[82], messages=[bad]), 1: Script()})
    train = app_task(nodes_app(max_retries=0), target="kubernetes", cfg={"namespace": "ml"}, client=fake)

    @flow
    def pipeline() -> dict:
        return train()

    with pytest.raises(StepFailed) as e:
        pipeline()
    assert e.value.result["state"] == "FAILED" and e.value.retryable is False


def test_job_variables_come_from_the_appdef() -> None:
    one = nodes_app()
    one.roles[0].num_replicas = 1
    one.roles[0].mounts = [specs.VolumeMount(src="datasets", dst_path="/data", read_only=True)]
    v = job_variables(one)
    assert v["image"] == "ghcr.io/acme/train:1"
    assert (v["cpu_request"], v["memory_request"], v["gpu_limit"]) == ("2", "4096Mi", 1)
    assert {"name": "mount-0", "persistentVolumeClaim": {"claimName": "datasets", "readOnly": True}} in v["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in v["volume_mounts"]
    assert v["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert v["secret_env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}]
    two = job_variables(nodes_app())  # the local target runs both replicas in the flow-run pod
    assert (two["cpu_request"], two["memory_limit"], two["gpu_limit"]) == ("4", "8192Mi", 2)
    launcher = job_variables(nodes_app(), target="kubernetes")
    assert launcher["cpu_request"] == "100m" and "gpu_limit" not in launcher


def test_the_base_job_template_renders_a_valid_gpu_job_with_our_variables() -> None:
    from prefect.client.schemas.objects import FlowRun
    from prefect_kubernetes.worker import KubernetesWorkerJobConfiguration

    one = nodes_app()
    one.roles[0].num_replicas = 1
    template = base_job_template()
    for name in ("cpu_request", "memory_limit", "gpu_limit", "volumes", "volume_mounts", "tolerations", "secret_env"):
        assert name in template["variables"]["properties"]
    values = {**job_variables(one), "namespace": "ml", "env": {"LOG_LEVEL": "info"}}
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, values))
    config.prepare_for_flow_run(FlowRun(id=uuid.uuid4(), name="nightly-1", flow_id=uuid.uuid4()))
    job = config.job_manifest
    job["metadata"]["name"] = job["metadata"].pop("generateName", "nightly-") + "x"
    kubernetes_validate.validate(job, MIN_KUBERNETES_VERSION, strict=True)
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["requests"]["cpu"] == "2"
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}} in container["env"]
    assert any(e["name"] == "LOG_LEVEL" for e in container["env"])  # Prefect's env prepended
    assert job["spec"]["backoffLimit"] == 0 and "completions" not in job["spec"]["template"]["spec"]
    assert job["spec"]["template"]["spec"]["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    # without our variables the template still renders a valid Job (unset keys drop out)
    plain = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, {"image": "img:1"}))
    plain.prepare_for_flow_run(FlowRun(id=uuid.uuid4(), name="nightly-2", flow_id=uuid.uuid4()))
    plain.job_manifest["metadata"]["name"] = "nightly-2-x"
    plain.job_manifest["metadata"].pop("generateName", None)
    kubernetes_validate.validate(plain.job_manifest, MIN_KUBERNETES_VERSION, strict=True)


FLOW_SCRIPT = r"""
import json, sys
import prefect.runtime
from prefect import flow
from torchstep.kubernetes import OfficialClient
from torchstep_prefect import app_task
from torchx import specs

kubeconfig, id_file, which = sys.argv[1:4]
role = specs.Role("trainer", image="ghcr.io/acme/train:1", entrypoint="python", args=["-m", "train"],
                  num_replicas=2, max_retries=0, metadata={"torchstep": {"nproc_per_node": 1}})
kube = OfficialClient.from_config(config_file=kubeconfig, in_cluster=False)
train = app_task(specs.AppDef("nodes", roles=[role]), target="kubernetes", cfg={"namespace": "ml"}, client=kube)

@flow
def pipeline():
    open(id_file, "w").write(str(prefect.runtime.flow_run.id))
    return train()

if which == "new":
    result = pipeline()
else:  # what `prefect flow-run execute <id>` does when the infrastructure restarts a crashed flow run
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow
    with get_client(sync_client=True) as client:
        result = run_flow(pipeline, flow_run=client.read_flow_run(which))
print("RESULT " + json.dumps(result), flush=True)
"""


def test_a_sigkilled_flow_run_process_re_executed_attaches_to_its_job(tmp_path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from kubehttp import Scenario, start_server
    from prefect.settings import PREFECT_API_URL

    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.75}).summary()
    server = start_server(
        tmp_path / "api", Scenario(replicas=2, run_s=8, lines=30, line_interval_s=0.2, messages=[ok, ok])
    )
    script, id_file = tmp_path / "flow.py", tmp_path / "flow_run_id"
    script.write_text(FLOW_SCRIPT)
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value()), "PYTHONUNBUFFERED": "1"}

    def run(which: str, log: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(script), str(server.kubeconfig), str(id_file), which],
            env=env,
            stdout=open(tmp_path / log, "wb"),
            stderr=subprocess.STDOUT,
        )

    try:
        first = run("new", "first.log")
        deadline = time.monotonic() + 120
        while "[trainer/1] line 3" not in (tmp_path / "first.log").read_text(errors="replace"):
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)  # the flow-run process dies with its Job running
        first.wait()
        second = run(id_file.read_text(), "second.log")
        assert second.wait(180) == 0, (tmp_path / "second.log").read_text()[-3000:]
        text = (tmp_path / "second.log").read_text()
        assert "attaching" in text and "[trainer/0] line 29" in text
        result = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
        assert result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.75}
        state = server.state()
        assert state["jobs_created"] == 1 and state["conflicts"] >= 1  # one gang of pods
        assert not [o for o in state["objects"] if o["labels"].get("torchstep/app-id")]
    finally:
        server.stop()


def test_each_execution_of_a_flow_run_numbers_its_calls_from_zero_even_at_a_reused_address(monkeypatch) -> None:
    """A re-execution in the same process must name its Jobs like the first execution did, even
    when its FlowRunContext lands at the address of the freed first one (CPython reuses it)."""
    from prefect.context import FlowRunContext

    class Execution:  # stands for one FlowRunContext; a fresh one per execution, freed after
        pass

    app = nodes_app()
    flow_run = uuid.uuid4()
    names = set()
    current: list = [None]
    monkeypatch.setattr(FlowRunContext, "get", classmethod(lambda cls: current[0]))
    for _ in range(50):
        current[0] = Execution()
        task_run = uuid.uuid4()
        first = tasks._logical_call(flow_run, "train-1a2b", app, task_run)
        second = tasks._logical_call(flow_run, "train-1a2b", app, uuid.uuid4())  # the same task called again
        assert tasks._logical_call(flow_run, "train-1a2b", app, task_run) == first  # a retry keeps its number
        names.add((first, second))
        assert first != second
        current[0] = None  # this execution ends: its context is freed
    assert len(names) == 1  # every execution: call 0 then call 1, the same two Job names


def test_a_forged_pod_with_replica_0s_labels_is_ignored_and_said_once_in_the_task_log(monkeypatch, caplog) -> None:
    """Someone allowed to create pods in the namespace made a bare pod with replica 0's
    labels (predictable from the flow run), its own lines and a forged result: the task's
    result and log are the Job's own; one warning line says what was ignored."""
    monkeypatch.setattr(tasks, "POLL_INTERVAL_S", 0.01)
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"model_uri": "s3://ours"}).summary()
    forged = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"model_uri": "s3://attacker"}).summary()
    fake = FakeKube({0: Script(lines=["[trainer/0] step 1"], messages=[ok]), 1: Script(messages=[ok])})
    fake.impersonate(["[trainer/0] FORGED step 1"], forged)
    train = app_task(nodes_app(max_retries=0), target="kubernetes", cfg={"namespace": "ml"}, client=fake)

    @flow
    def pipeline():
        return train()

    with caplog.at_level("INFO"):
        result = pipeline()
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"model_uri": "s3://ours"}
    task_log = [r.getMessage() for r in caplog.records if r.name.startswith("prefect.task_runs")]
    assert "[trainer/0] step 1 (pod 0)" in task_log and not [m for m in task_log if "FORGED" in m]
    assert len([m for m in task_log if "ignoring pod ml/" in m and "-0-evil" in m]) == 1, task_log
