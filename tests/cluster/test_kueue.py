"""Kueue, as platform teams run it (issue 36, goal 4), on the one-machine cluster with the
test controller of tests/cluster/kueue.py playing Kueue's visible contract. Each test names
the behaviours of Kueue it covers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cluster.harness import Cluster
from cluster.kueue import QUEUE_LABEL, Kueue
from cluster.test_preemption import STEPS, checkpointed, start


@pytest.mark.slow
def test_queued_admitted_with_a_node_selector_evicted_and_readmitted_resumes_from_the_checkpoint(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    """Kueue behaviours covered: a Job of a LocalQueue stays suspended until admitted (no pod
    runs); admission injects the flavor's nodeSelector and tolerations into the pod template
    and unsuspends; eviction (preemption by a higher-priority workload) suspends the Job again,
    restores its template and its pods are deleted uncounted; the requeued Workload is
    admitted again, elsewhere."""
    kueue = Kueue(real_cluster)
    ckpt = tmp_path / "ckpt"
    rendered, lines, done, runner = start(real_cluster, checkpointed(ckpt, replicas=2), queue="team-a")
    name = rendered.roles[0].name
    job = rendered.roles[0].workload
    assert job["spec"]["suspend"] is True and job["metadata"]["labels"][QUEUE_LABEL] == "team-a"
    assert job["spec"]["backoffLimit"] == 0  # no retry budget: an uncounted eviction is the only way through

    # queued: the step waits, says so, and nothing runs
    queued = f"torchstep: Job {name} queued (waiting for admission by Kueue, queue team-a)"
    real_cluster.wait(lambda: queued in lines, 60, "the watcher to say the Job is queued")
    time.sleep(1.0)
    assert [j["metadata"]["name"] for j in kueue.queued("team-a")] == [name]
    assert not real_cluster.items("pods", rendered.label_selector) and not done

    # admitted onto node-1 (the flavor's nodeSelector, and a toleration, injected)
    toleration = {"key": "flavor", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
    kueue.admit(name, {"kubernetes.io/hostname": "node-1"}, [toleration])
    real_cluster.wait(lambda: (ckpt / "step-0003").exists(), 120, "the admitted step to save its 4th checkpoint")
    pods = real_cluster.items("pods", rendered.label_selector)
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {"node-1"}
    assert all(toleration in p["spec"]["tolerations"] for p in pods)
    assert any(line.startswith(f"torchstep: Job {name} admitted by Kueue (queue team-a), nodeSelector ")
               and "'kubernetes.io/hostname': 'node-1'" in line for line in lines), lines  # fmt: skip

    # evicted: suspended again, its pods deleted; the step waits in the queue again
    kueue.evict(name)
    real_cluster.wait(lambda: not real_cluster.items("pods", rendered.label_selector), 60, "the evicted pods to go")
    real_cluster.wait(lambda: any("was evicted (suspended again, its pods deleted)" in x for x in lines), 30,
                      "the watcher to say the Job was evicted")  # fmt: skip
    evicted = next(x for x in lines if "was evicted" in x)
    assert "preemption 1 of at most 10 (preemption_retries)" in evicted and "queued again" in evicted
    assert "nodeSelector" not in real_cluster.get("jobs", name)["spec"]["template"]["spec"]  # template restored
    assert not done

    # admitted again on node-0: resumes from the checkpoint, succeeds, nothing counted
    kueue.admit(name, {"kubernetes.io/hostname": "node-0"})
    runner.join(240)
    assert done, "JobGang did not return"
    result = done[0]
    assert result.state == "SUCCEEDED", (result.summary(), lines)
    resumed = [x for x in lines if "resumed from step-" in x]
    assert resumed and all(int(x.rsplit("step-", 1)[1]) >= 3 for x in resumed), lines
    assert any(f"done at step {STEPS - 1}" in x for x in lines)
    final = real_cluster.get("jobs", name)
    assert final["status"]["failed"] == 0
    assert {p["spec"]["nodeName"] for p in real_cluster.items("pods", rendered.label_selector)} == {"node-0"}
    assert any(w.startswith("preempted 1 time (0 pod(s) with DisruptionTarget, 1 Kueue eviction(s))")
               for w in result.warnings), result.warnings  # fmt: skip
