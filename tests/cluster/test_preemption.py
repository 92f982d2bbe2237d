"""Preemption is not failure (issue 36, goal 3), on the one-machine cluster: a step whose pod
is evicted with ``DisruptionTarget`` (a node drain) is replaced by the Job controller without
spending any retry budget, resumes from its checkpoint (``torchstep.last_checkpoint()``) and
succeeds; a bare Pod (which Kubernetes never replaces) is created again by the watcher, and
resumes likewise; beyond ``preemption_retries`` the step ends PREEMPTED, not retryable."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
import torchstep
from torchstep.kubernetes import JobGang, OfficialClient
from torchx import specs

from cluster.harness import Cluster

CHECKPOINTED = Path(__file__).resolve().parent / "apps" / "checkpointed.py"
STEPS = 16


def checkpointed(ckpt: Path, replicas: int = 1) -> specs.AppDef:
    """tests/cluster/apps/checkpointed.py with its checkpoint directory on a host mount; no
    retries at all (APPLICATION, 0: the Job's backoffLimit is 0, a counted failure ends it)."""
    ckpt.mkdir(mode=0o700, exist_ok=True)
    role = specs.Role(
        "t",
        image="unused",
        entrypoint="python",
        args=[str(CHECKPOINTED), "--steps", str(STEPS), "--stop-s", "2"],
        env={"TORCHSTEP_CHECKPOINT_DIR": "/ckpt"},
        num_replicas=replicas,
        max_retries=0,
        mounts=[specs.BindMount(src_path=str(ckpt), dst_path="/ckpt")],
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    )
    return specs.AppDef("ckpt", roles=[role])


def start(
    cluster: Cluster, app: specs.AppDef, poll_s: float = 0.5, **cfg: Any
) -> tuple[Any, list[str], list[Any], threading.Thread]:
    """JobGang.run of ``app`` in a thread (the test acts on the cluster meanwhile); the
    official client watches, ``poll_s`` is only the log followers' reattach pace."""
    rendered = torchstep.kubernetes.render_app(app, namespace="ml", cfg={"run_id": f"r{uuid.uuid4().hex[:6]}", **cfg})
    kube = OfficialClient.from_config(config_file=str(cluster.kubeconfig), in_cluster=False)
    lines: list[str] = []
    done: list[Any] = []
    gang = JobGang(rendered, kube, on_line=lines.append, poll_interval=poll_s, on_finish="keep")
    runner = threading.Thread(target=lambda: done.append(gang.run()), daemon=True)
    runner.start()
    return rendered, lines, done, runner


def running_pod(cluster: Cluster, rendered: Any) -> dict[str, Any] | None:
    return next(
        (
            p
            for p in cluster.items("pods", rendered.label_selector)
            if p["status"]["phase"] == "Running" and "deletionTimestamp" not in p["metadata"]
        ),
        None,
    )


@pytest.mark.slow
def test_a_drained_step_resumes_from_its_checkpoint_and_succeeds_with_no_retry_spent(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    rendered, lines, done, runner = start(real_cluster, checkpointed(ckpt), pod=False)
    job_name = rendered.roles[0].name
    assert rendered.roles[0].workload["spec"]["backoffLimit"] == 0  # no retry budget at all
    real_cluster.wait(lambda: (ckpt / "step-0003").exists(), 120, "the step to save its 4th checkpoint")
    first = running_pod(real_cluster, rendered)
    assert first is not None
    evicted = real_cluster.server.node(first["spec"]["nodeName"], "drain")["pods"]
    assert first["metadata"]["name"] in evicted
    runner.join(240)
    assert done, "JobGang did not return"
    result = done[0]
    assert result.state == "SUCCEEDED", (result.summary(), lines)
    # the replacement started where the evicted pod's last checkpoint left off, and finished
    resumed = [line for line in lines if "resumed from step-" in line]
    assert len(resumed) == 1, lines
    assert int(resumed[0].rsplit("step-", 1)[1]) >= 3
    assert any(f"done at step {STEPS - 1}" in line for line in lines)
    assert sorted(p.name for p in ckpt.iterdir())[-1] == f"step-{STEPS - 1:04d}"
    # the Job never counted it: no failure, no condition but Complete, within backoffLimit 0
    job = real_cluster.get("jobs", job_name)
    assert job["status"]["failed"] == 0 and job["status"]["succeeded"] == 1
    assert {c["type"] for c in job["status"]["conditions"]} == {"Complete", "SuccessCriteriaMet"}
    said = [line for line in lines if "was preempted" in line]
    assert len(said) == 1 and "DisruptionTarget: EvictionByEvictionAPI" in said[0], said
    assert "preemption 1 of at most 10 (preemption_retries); the step's retries are untouched" in said[0]
    assert any(w.startswith("preempted 1 time (1 pod(s) with DisruptionTarget") for w in result.warnings)
    assert result.retryable is False and result.attempts == 1


@pytest.mark.slow
def test_a_drained_bare_pod_is_created_again_and_resumes_from_its_checkpoint(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    rendered, lines, done, runner = start(real_cluster, checkpointed(ckpt))
    name = rendered.roles[0].name
    assert rendered.roles[0].kind == "Pod"  # 1 replica, no retries: what KubernetesPodOperator would run
    real_cluster.wait(lambda: (ckpt / "step-0003").exists(), 120, "the step to save its 4th checkpoint")
    first = running_pod(real_cluster, rendered)
    assert first is not None
    real_cluster.server.node(first["spec"]["nodeName"], "drain")
    runner.join(240)
    assert done, "JobGang did not return"
    result = done[0]
    assert result.state == "SUCCEEDED", (result.summary(), lines)
    resumed = [line for line in lines if "resumed from step-" in line]
    assert len(resumed) == 1 and int(resumed[0].rsplit("step-", 1)[1]) >= 3, lines
    assert any(f"done at step {STEPS - 1}" in line for line in lines)
    (pod,) = real_cluster.items("pods", rendered.label_selector)
    assert pod["metadata"]["name"] == name and pod["metadata"]["uid"] != first["metadata"]["uid"]
    assert pod["spec"]["nodeName"] != first["spec"]["nodeName"]  # the drained node is cordoned
    assert f"torchstep: pod {name} created again after its preemption" in lines
    assert any(w.startswith("preempted 1 time (1 pod(s) with DisruptionTarget") for w in result.warnings)


@pytest.mark.slow
def test_preemptions_beyond_the_budget_end_the_step_preempted_and_delete_it(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    """The evicted pod is SIGKILLed and gone at once (grace 0), its replacement already
    created by the Job controller: a watcher that read the cluster every few seconds never
    saw it (the step would go on and succeed); the watch's events count it."""
    ckpt = tmp_path / "ckpt"
    rendered, lines, done, runner = start(real_cluster, checkpointed(ckpt), 30.0, pod=False, preemption_retries=0)
    real_cluster.wait(lambda: (ckpt / "step-0001").exists(), 120, "the step to save a checkpoint")
    first = running_pod(real_cluster, rendered)
    assert first is not None
    real_cluster.server.node(first["spec"]["nodeName"], "drain", grace_s=0)
    real_cluster.wait(
        lambda: (
            not [
                p
                for p in real_cluster.items("pods", rendered.label_selector)
                if p["metadata"]["uid"] == first["metadata"]["uid"]
            ]
        ),
        30,
        "the evicted pod to go",
    )
    runner.join(120)
    assert done, "JobGang did not return"
    result = done[0]
    assert result.state == "PREEMPTED" and result.retryable is False, result.summary()
    assert result.message.startswith("preempted 1 time, more than preemption_retries=0 allows")
    assert result.app_status().state.name == "FAILED"  # TorchX has no PREEMPTED: FAILED, with the message
    # a PREEMPTED step keeps nothing running, whatever on_finish says
    real_cluster.wait(lambda: not real_cluster.items("pods", rendered.label_selector), 60, "the run's pods to go")
    # deleted with its pods (foreground): the Job goes once they have
    real_cluster.wait(lambda: not real_cluster.items("jobs", rendered.label_selector), 60, "the run's Job to go")
