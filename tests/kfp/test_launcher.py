"""The launcher step of a multi-node AppDef (what ``python3 -m torchstep_kfp.entry`` does in
the KFP pod), against the recorded Kubernetes fake (no cluster here): the Jobs it submits
validate strictly, every pod's lines reach the step log, the merged result becomes the
output parameter, and a SIGTERM (the pipeline run cancelled) deletes everything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubefake import DyingOnce, FakeKube, Script, WatcherDies
from kubehttp import Scenario, start_server
from torchstep.kubernetes import MIN_KUBERNETES_VERSION
from torchstep.result import StepResult

pytest.importorskip("kfp")
from torchstep_kfp import component_from_fn, entry  # noqa: E402

NODES = f"{Path(__file__).resolve().parents[1] / 'apps' / 'steps.py'}:nodes"


def argv(tmp_path: Path, **inputs: Any) -> list[str]:
    op = component_from_fn(NODES)
    args = op.component.component_spec.implementation.container.args
    spec = args[args.index("--spec") + 1]
    executor_input = {
        "outputs": {
            "parameters": {"result": {"outputFile": str(tmp_path / "out" / "result")}},
            "outputFile": str(tmp_path / "out" / "executor_output.json"),
        }
    }
    executor_input["inputs"] = {"parameterValues": {"torchstep_job_id": "job-1"}}
    out = ["--spec", spec, "--executor_input", json.dumps(executor_input)]
    for name, value in inputs.items():
        out += ["--in", name, value if isinstance(value, str) else json.dumps(value)]
    return out


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(entry, "POLL_INTERVAL_S", 0.01)
    monkeypatch.setenv("TORCHSTEP_NAMESPACE", "ml")
    monkeypatch.setenv("TORCHSTEP_POD_NAME", "p-launcher-1")


def test_the_launcher_submits_valid_jobs_streams_every_pod_and_returns_the_merged_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.25}).summary()
    fake = FakeKube({0: Script(lines=["[trainer/0] step 1"], messages=[ok]), 1: Script(lines=["[trainer/1] step 1"])})
    rc = entry.main(argv(tmp_path, replicas=2, nproc_per_node=1), client=fake)
    assert rc == 0
    kinds = [o["kind"] for o in fake.objects]
    assert kinds == ["Job", "Service", "NetworkPolicy"]
    for obj in fake.objects:
        assert obj["metadata"]["namespace"] == "ml"
        clean = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "uid"}}
        kubernetes_validate.validate(clean, MIN_KUBERNETES_VERSION, strict=True)
    job = fake.objects[0]
    assert job["spec"]["parallelism"] == 2 and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "ghcr.io/acme/train:1"
    assert job["spec"]["backoffLimit"] == 0  # APPLICATION retries are KFP's set_retry, never the Job's
    out = capsys.readouterr().out
    assert "[trainer/0] step 1 (pod 0)" in out and "[trainer/1] step 1 (pod 0)" in out  # pod 0 of each index
    result = json.loads((tmp_path / "out" / "result").read_text())
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.25}
    assert [r["replica_id"] for r in result["replicas"]] == [0, 1]
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}  # nothing left behind


def test_run_ids_differ_per_kfp_run_task_and_retry_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = []
    for job, pod in (("job-1", "p-1"), ("job-2", "p-1"), ("job-1", "p-2")):
        monkeypatch.setenv("TORCHSTEP_POD_NAME", pod)  # a KFP retry runs in a new pod
        fake = FakeKube({0: Script(), 1: Script()})
        args = argv(tmp_path, replicas=2) + ["--job-id", job]
        assert entry.main(args, client=fake) == 0
        ids.append(fake.objects[0]["metadata"]["labels"]["torchstep/app-id"])
    assert len(set(ids)) == 3


def with_task_id(args: list[str], task_id: str) -> list[str]:
    i = args.index("--executor_input") + 1
    executor_input = json.loads(args[i])
    executor_input["inputs"]["parameterValues"]["torchstep_task_id"] = task_id
    return [*args[:i], json.dumps(executor_input), *args[i + 1 :]]


def test_a_retried_launcher_pod_attaches_to_the_jobs_its_dead_predecessor_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.5}).summary()
    fake = DyingOnce({0: Script(lines=["[trainer/0] step 1"], messages=[ok]), 1: Script(messages=[ok])})
    args = with_task_id(argv(tmp_path, replicas=2), "task-uuid-7")
    with pytest.raises(WatcherDies):
        entry.main(args, client=fake)
    assert [o["kind"] for o in fake.objects] == ["Job", "Service", "NetworkPolicy"] and not fake.deleted
    fake.dead = False
    monkeypatch.setenv("TORCHSTEP_POD_NAME", "p-launcher-1-retry")  # KFP's retry: a new pod, the same task id
    assert entry.main(args, client=fake) == 0
    assert [o["kind"] for o in fake.objects] == ["Job", "Service", "NetworkPolicy"]  # attached: no second gang
    assert "attaching" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "result").read_text())["outputs"] == {"loss": 0.5}
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_cancelling_the_run_while_reattached_deletes_every_job_and_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = DyingOnce({0: Script(), 1: Script()}, polls=10**6)  # never finishes by itself
    args = with_task_id(argv(tmp_path, replicas=2), "task-uuid-8")
    with pytest.raises(WatcherDies):
        entry.main(args, client=fake)
    fake.dead = False
    monkeypatch.setenv("TORCHSTEP_POD_NAME", "p-launcher-1-retry")
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()  # KFP terminates the run
    assert entry.main(args, client=fake) == 143
    assert fake.conflicts >= 1 and sum(o["kind"] == "Job" for o in fake.objects) == 1  # it was attached
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}


def test_a_failed_job_fails_the_step_with_its_exit_code_and_root_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = StepResult(app_id="x", state="FAILED", exit_code=3, message="rank 0 worker_failed (exit 3)").summary()
    fake = FakeKube({0: Script(codes=[3], messages=[bad]), 1: Script()})
    rc = entry.main(argv(tmp_path, replicas=2), client=fake)
    assert rc == 3
    assert json.loads((tmp_path / "out" / "result").read_text())["state"] == "FAILED"
    assert "exit 3" in capsys.readouterr().err


def test_sigterm_of_the_launcher_deletes_every_job_and_pod(tmp_path: Path) -> None:
    fake = FakeKube({0: Script(), 1: Script()}, polls=10**6)  # never finishes by itself
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    rc = entry.main(argv(tmp_path, replicas=2), client=fake)
    assert rc == 143
    assert time.monotonic() - t0 < 30
    assert {kind for kind, _, _ in fake.deleted} >= {"jobs", "pods"}
    assert signal.getsignal(signal.SIGTERM) is not None  # the handler was put back


def test_inputs_that_change_the_step_shape_at_run_time_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = entry.main(argv(tmp_path, replicas=1), client=FakeKube())
    assert rc == 2
    assert "compiled for the other shape" in capsys.readouterr().err


def test_a_bad_invocation_names_the_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = argv(tmp_path, replicas=2) + ["--in", "nope", "1"]
    assert entry.main(args, client=FakeKube()) == 2
    assert "nope" in capsys.readouterr().err


# -- a real launcher process SIGKILLed and retried, against tests/kubehttp.py --------------------------
def launcher(args: list[str], server, pod: str, out: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(server.kubeconfig),
        "TORCHSTEP_NAMESPACE": "ml",
        "TORCHSTEP_POD_NAME": pod,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.Popen(
        [sys.executable, "-m", "torchstep_kfp.entry", *args], env=env, stdout=open(out, "wb"), stderr=subprocess.STDOUT
    )


def test_a_sigkilled_launcher_pod_retried_by_kfp_attaches_to_its_jobs(tmp_path: Path) -> None:
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"loss": 0.5}).summary()
    server = start_server(
        tmp_path / "api", Scenario(replicas=2, run_s=6, lines=30, line_interval_s=0.15, messages=[ok, ok])
    )
    try:
        args = with_task_id(argv(tmp_path, replicas=2), "task-uuid-9")
        first = launcher(args, server, "pipeline-abc-launcher-1", tmp_path / "first.log")
        deadline = time.monotonic() + 90
        while "[trainer/1] line 5" not in (tmp_path / "first.log").read_text(errors="replace"):
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "first.log").read_text()
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)  # the launcher pod is gone (node lost, OOM)
        first.wait()
        second = launcher(args, server, "pipeline-abc-launcher-2", tmp_path / "second.log")  # KFP's retry
        assert second.wait(120) == 0, (tmp_path / "second.log").read_text()[-3000:]
        text = (tmp_path / "second.log").read_text()
        assert "attaching" in text and "[trainer/0] line 29" in text
        state = server.state()
        assert state["jobs_created"] == 1 and state["conflicts"] >= 1  # one gang of pods
        result = json.loads((tmp_path / "out" / "result").read_text())
        assert result["state"] == "SUCCEEDED" and result["outputs"] == {"loss": 0.5}
        assert not [o for o in state["objects"] if o["labels"].get("torchstep/app-id")]  # cleaned up
    finally:
        server.stop()


def test_a_forged_pod_with_replica_0s_labels_changes_neither_the_output_nor_the_step_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Someone allowed to create pods in the namespace made a bare pod with replica 0's
    labels (predictable from the KFP run), its own lines and a forged result."""
    ok = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"model_uri": "s3://ours"}).summary()
    forged = StepResult(app_id="x", state="SUCCEEDED", exit_code=0, outputs={"model_uri": "s3://attacker"}).summary()
    fake = FakeKube({0: Script(lines=["[trainer/0] step 1"], messages=[ok]), 1: Script(lines=["[trainer/1] step 1"])})
    fake.impersonate(["[trainer/0] FORGED step 1"], forged)
    assert entry.main(argv(tmp_path, replicas=2, nproc_per_node=1), client=fake) == 0
    result = json.loads((tmp_path / "out" / "result").read_text())
    assert result["outputs"] == {"model_uri": "s3://ours"} and [r["replica_id"] for r in result["replicas"]] == [0, 1]
    out = capsys.readouterr().out
    assert "[trainer/0] step 1 (pod 0)" in out and "FORGED" not in out
    assert out.count("ignoring pod ml/") == 1 and "-0-evil" in out


def test_too_many_kept_failed_jobs_is_a_run_error_that_no_retry_can_help(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run id of the task's attempt names a failed Job that was kept: a RunError (not a
    SpecError: the input is fine), not retryable, so the step exits 82 and says the fix."""
    from torchstep.steps import KubernetesStep

    monkeypatch.setattr(KubernetesStep, "state", lambda self: "FAILED")
    assert entry.main(argv(tmp_path, replicas=2, nproc_per_node=1), client=FakeKube({})) == 82
    err = capsys.readouterr().err
    assert "failed Jobs of it are still kept; fix: delete the failed Jobs" in err
