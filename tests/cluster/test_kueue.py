"""Kueue, as platform teams run it (issue 36, goal 4), on the one-machine cluster with the
test controller of tests/cluster/kueue.py playing Kueue's visible contract. Each test names
the behaviours of Kueue it covers."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest
from torchx import specs

from cluster.harness import Cluster
from cluster.kueue import PODS_READY_TIMEOUT, QUEUE_LABEL, WAIT_FOR_RECOVERY, Kueue, WaitForPodsReady
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
    assert any(
        line.startswith(f"torchstep: Job {name} admitted by Kueue (queue team-a), nodeSelector ")
        and "'kubernetes.io/hostname': 'node-1'" in line
        for line in lines
    ), lines

    # evicted: suspended again, its pods deleted; the step waits in the queue again
    kueue.evict(name)
    real_cluster.wait(lambda: not real_cluster.items("pods", rendered.label_selector), 60, "the evicted pods to go")
    real_cluster.wait(
        lambda: any("was evicted (suspended again, its pods deleted)" in x for x in lines),
        30,
        "the watcher to say the Job was evicted",
    )
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
    assert any(
        w.startswith("preempted 1 time (0 pod(s) with DisruptionTarget, 1 Kueue eviction(s))") for w in result.warnings
    ), result.warnings


def looped(ckpt: Path, steps: int, hold: bool = False) -> specs.AppDef:
    """A 2-replica :func:`checkpointed` step of ``steps`` quarter-second steps; with ``hold``,
    its ranks then wait for ``release(ckpt)`` (the test creates it) before they end. The
    marker lives beside the checkpoint directory, never in it: a rank that starts late (a
    loaded machine) would take it for the newest checkpoint."""
    app = checkpointed(ckpt, replicas=2)
    role = app.roles[0]
    args = list(role.args)
    args[args.index("--steps") + 1] = str(steps)
    mounts = list(role.mounts)
    if hold:
        release(ckpt).parent.mkdir(mode=0o700, exist_ok=True)
        args += ["--hold", "/gate/release"]
        mounts.append(specs.BindMount(src_path=str(release(ckpt).parent), dst_path="/gate"))
    return specs.AppDef(app.name, roles=[dataclasses.replace(role, args=args, mounts=mounts)])


def release(ckpt: Path) -> Path:
    """The file a held :func:`looped` step waits for."""
    return ckpt.parent / f"{ckpt.name}-gate" / "release"


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


@pytest.mark.slow
def test_a_gang_is_ready_once_its_rendezvous_formed_and_stays_admitted(real_cluster: Cluster, tmp_path: Path) -> None:
    """Kueue behaviours covered: waitForPodsReady counts a Job's ready pods (its
    ``status.ready``, which the pods' readinessProbes decide); a Job whose pods all turn
    Ready within the timeout gets ``PodsReady=True`` (``Started``) and is never evicted.
    The probe makes Ready mean "the gang formed": a pod whose agent waits in the rendezvous
    for a peer still pulling its image is Running but not Ready."""
    kueue = Kueue(real_cluster, WaitForPodsReady(timeout_s=90, backoff_base_s=1))
    try:
        real_cluster.server.node("node-1", "slow-pulls", seconds=8)  # one replica starts 8 s late
        # the ranks hold after their steps until the test has seen the gang Ready: a loaded
        # machine may take longer to start both than the steps take to run
        rendered, lines, done, runner = start(real_cluster, looped(tmp_path / "ckpt", 8, hold=True), queue="team-a")
        name = rendered.roles[0].name
        real_cluster.wait(lambda: any("queued" in x for x in lines), 60, "the step to be queued")
        kueue.admit(name)
        # the early pod runs, waiting in the rendezvous: not Ready while its peer is not started
        early = real_cluster.wait(
            lambda: next(
                (
                    p
                    for p in real_cluster.items("pods", rendered.label_selector)
                    if p["status"].get("phase") == "Running"
                ),
                None,
            ),
            60,
            "a pod to run",
        )
        waited = 0
        while any(p["status"].get("phase") == "Pending" for p in real_cluster.items("pods", rendered.label_selector)):
            assert not ready(real_cluster.get("pods", early["metadata"]["name"])), "Ready before the gang formed"
            assert kueue.condition(name, "PodsReady")["reason"] == "WaitForStart"
            waited += 1
            time.sleep(0.5)
        assert waited >= 4, "the late pod started before the early pod could be watched waiting"
        # both started: the rendezvous forms, both pods turn Ready, the Workload is PodsReady
        real_cluster.wait(
            lambda: real_cluster.get("jobs", name)["status"].get("ready") == 2 or done,
            120,
            "both pods Ready",
        )
        assert not done, ("the step ended before both its pods were Ready", done[0].summary(), lines)
        real_cluster.wait(
            lambda: (kueue.condition(name, "PodsReady") or {}).get("status") == "True",
            10,
            "the Workload to be PodsReady",
        )
        assert kueue.condition(name, "PodsReady")["reason"] == "Started"
        release(tmp_path / "ckpt").touch()
        runner.join(240)
        assert done and done[0].state == "SUCCEEDED", (done and done[0].summary(), lines)
        assert kueue.evictions == [] and kueue.condition(name, "Evicted") is None
        assert not any("was evicted" in x for x in lines)
    finally:
        release(tmp_path / "ckpt").touch()  # a failed check leaves no step holding
        kueue.close()


@pytest.mark.slow
def test_a_gang_that_cannot_form_is_evicted_by_wait_for_pods_ready_requeued_and_spends_no_retry(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    """Kueue behaviours covered: waitForPodsReady's timeout evicts an admitted Job whose pods
    are not all Ready (one replica's pod cannot start: its node's image pull never ends, so
    the other's agent waits in the rendezvous, unready): ``Evicted`` with reason
    ``PodsReadyTimeout``, the Job suspended again and its pods deleted uncounted,
    ``Requeued=False`` until the requeuing backoff (``requeueState``) has passed, then
    ``BackoffFinished``; admitted again where the gang can form, it succeeds. The step's
    retry budget is never spent: the eviction is a preemption."""
    kueue = Kueue(real_cluster, WaitForPodsReady(timeout_s=20, backoff_base_s=2))
    try:
        real_cluster.server.node("node-1", "slow-pulls", seconds=3600)  # this node's pods never start
        rendered, lines, done, runner = start(real_cluster, looped(tmp_path / "ckpt", 8), queue="team-a")
        name = rendered.roles[0].name
        assert rendered.roles[0].workload["spec"]["backoffLimit"] == 0  # a counted failure would end the step
        real_cluster.wait(lambda: any("queued" in x for x in lines), 60, "the step to be queued")
        kueue.admit(name)
        evicted = real_cluster.wait(
            lambda: kueue.condition(name, "Evicted") if name in kueue.evictions else None,
            60,
            "waitForPodsReady to evict the Job",
        )
        assert (evicted["status"], evicted["reason"]) == ("True", "PodsReadyTimeout")
        assert evicted["message"] == f"Exceeded the PodsReady timeout ml/{name}"
        assert real_cluster.get("jobs", name)["spec"]["suspend"] is True
        requeued = kueue.condition(name, "Requeued")
        assert (requeued["status"], requeued["reason"]) == ("False", "PodsReadyTimeout")
        assert kueue.workload(name)["status"]["requeueState"]["count"] == 1
        real_cluster.wait(lambda: not real_cluster.items("pods", rendered.label_selector), 60, "the evicted pods to go")
        real_cluster.wait(
            lambda: any("was evicted (suspended again, its pods deleted)" in x for x in lines),
            30,
            "the watcher to say the Job was evicted",
        )
        # the backoff passes: requeued; admitted again onto node-0, where both pods start (a
        # machine loaded past the timeout may evict the healthy gang too: it is admitted again)
        for _ in range(3):
            evictions = len(kueue.evictions)
            real_cluster.wait(
                lambda: (kueue.condition(name, "Requeued") or {}).get("reason") == "BackoffFinished",
                60,
                "the requeuing backoff to pass",
            )
            kueue.admit(name, {"kubernetes.io/hostname": "node-0"})
            real_cluster.wait(lambda: done or len(kueue.evictions) > evictions, 240, "the step to end or be evicted")
            if done:
                break
        runner.join(60)
        pods = [
            (p["metadata"]["name"], p["spec"].get("nodeName"), p["status"].get("phase"), ready(p))
            for p in real_cluster.items("pods", rendered.label_selector)
        ]
        assert done, ("JobGang did not return", pods, kueue.workload(name), lines[-40:])
        result = done[0]
        assert result.state == "SUCCEEDED", (result.summary(), lines)
        assert (kueue.condition(name, "PodsReady") or {}).get("reason") == "Started"
        count = len(kueue.evictions)  # 1, unless the loaded machine needed more than the timeout
        assert kueue.workload(name)["status"]["requeueState"]["count"] == count
        job = real_cluster.get("jobs", name)
        assert job["status"]["failed"] == 0  # the evicted pods were never counted
        assert result.retryable is False and result.attempts == 1
        times = "time" if count == 1 else "times"
        assert any(
            w.startswith(f"preempted {count} {times} (0 pod(s) with DisruptionTarget, {count} Kueue eviction(s))")
            for w in result.warnings
        ), result.warnings
    finally:
        kueue.close()


INDEX = "batch.kubernetes.io/job-completion-index"


def elastic(ckpt: Path, steps: int) -> specs.AppDef:
    """A 2-replica :func:`looped` step that trains on at one replica (``--nnodes 1:2``): a
    replica lost is a membership change for the other, never a failure."""
    app = looped(ckpt, steps)
    return specs.AppDef(app.name, roles=[dataclasses.replace(app.roles[0], min_replicas=1)])


def running_gang(cluster: Cluster, kueue: Kueue, steps: int, ckpt: Path, config: WaitForPodsReady) -> tuple[Any, ...]:
    """An :func:`elastic` step queued, admitted and ``PodsReady`` (``Started``), its two pods
    on the two nodes; returns what :func:`start` does and the running pod of index 1."""
    rendered, lines, done, runner = start(cluster, elastic(ckpt, steps), queue="team-a")
    name = rendered.roles[0].name
    assert rendered.roles[0].workload["spec"]["backoffLimit"] == 0  # a counted failure would end the step
    cluster.wait(lambda: any("queued" in x for x in lines), 60, "the step to be queued")
    kueue.admit(name)
    cluster.wait(
        lambda: (kueue.condition(name, "PodsReady") or {}).get("status") == "True",
        config.timeout_s,
        "the gang to form and the Workload to be PodsReady",
    )
    assert kueue.condition(name, "PodsReady")["reason"] == "Started"
    pods = {p["metadata"]["annotations"][INDEX]: p for p in cluster.items("pods", rendered.label_selector)}
    assert pods["0"]["spec"]["nodeName"] != pods["1"]["spec"]["nodeName"], "the scheduler spreads the gang"
    return rendered, lines, done, runner, pods["1"]


@pytest.mark.slow
def test_a_gang_that_lost_a_pod_and_recovers_within_the_recovery_timeout_stays_admitted(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    """Kueue behaviours covered: ``waitForPodsReady.recoveryTimeout``: a Job that was
    ``PodsReady`` and lost a pod (its node drained: ``DisruptionTarget``, replaced by the Job
    controller, uncounted) is ``PodsReady=False`` (``WaitForRecovery``) until the replacement
    is Ready, i.e. has joined the gang; within the timeout it is ``PodsReady=True``
    (``Recovered``) and never evicted. The step says one preemption, spends no retry."""
    config = WaitForPodsReady(timeout_s=120, backoff_base_s=1, recovery_timeout_s=120)
    kueue = Kueue(real_cluster, config)
    try:
        rendered, lines, done, runner, lost = running_gang(real_cluster, kueue, 160, tmp_path / "ckpt", config)
        name = rendered.roles[0].name
        real_cluster.server.node(lost["spec"]["nodeName"], "drain")  # the replacement starts on the other node
        runner.join(300)
        assert done, ("JobGang did not return", kueue.workload(name), lines[-40:])
        result = done[0]
        assert result.state == "SUCCEEDED", (result.summary(), lines)
        podsready = kueue.condition(name, "PodsReady")
        assert (podsready["status"], podsready["reason"]) == ("True", "Recovered"), kueue.workload(name)
        assert kueue.evictions == [] and kueue.condition(name, "Evicted") is None
        assert not any("was evicted" in x for x in lines)
        assert real_cluster.get("jobs", name)["status"]["failed"] == 0
        replacement = next(
            p
            for p in real_cluster.items("pods", rendered.label_selector)
            if p["metadata"]["annotations"][INDEX] == "1" and p["metadata"]["uid"] != lost["metadata"]["uid"]
        )
        assert replacement["spec"]["nodeName"] != lost["spec"]["nodeName"]
        assert any("resumed from step-" in x for x in lines), lines  # the replacement's worker group
        assert result.retryable is False and result.attempts == 1
        assert any(
            w.startswith("preempted 1 time (1 pod(s) with DisruptionTarget, 0 Kueue eviction(s))")
            for w in result.warnings
        ), result.warnings
    finally:
        kueue.close()


@pytest.mark.slow
def test_a_gang_that_does_not_recover_within_the_recovery_timeout_is_evicted_requeued_and_spends_no_retry(
    real_cluster: Cluster, tmp_path: Path
) -> None:
    """Kueue behaviours covered: ``waitForPodsReady.recoveryTimeout``: a Job that was
    ``PodsReady`` and lost a pod whose replacement cannot start (the only schedulable node's
    image pull never ends) stays ``PodsReady=False`` (``WaitForRecovery``); past
    ``recoveryTimeout`` it is evicted as for the first timeout (``Evicted`` and
    ``Requeued=False`` with reason ``PodsReadyTimeout``, the requeuing backoff,
    ``schedulingStats.evictions`` under ``underlyingCause`` ``WaitForRecovery``); requeued
    and admitted again where both pods start, it resumes from its checkpoint and succeeds.
    Neither the lost pod nor the eviction spends a retry: two preemptions."""
    config = WaitForPodsReady(timeout_s=120, backoff_base_s=1, recovery_timeout_s=15)
    kueue = Kueue(real_cluster, config)
    try:
        ckpt = tmp_path / "ckpt"
        rendered, lines, done, runner, lost = running_gang(real_cluster, kueue, 200, ckpt, config)
        name = rendered.roles[0].name
        drained = lost["spec"]["nodeName"]
        other = next(n for n in ("node-0", "node-1") if n != drained)
        real_cluster.server.node(other, "slow-pulls", seconds=3600)  # the replacement never starts
        real_cluster.server.node(drained, "drain")
        recovering = real_cluster.wait(
            lambda: (c := kueue.condition(name, "PodsReady")) and c["reason"] == WAIT_FOR_RECOVERY and c,
            60,
            "the Workload to wait for recovery",
        )
        assert recovering["status"] == "False" and name not in kueue.evictions
        evicted = real_cluster.wait(
            lambda: kueue.condition(name, "Evicted") if name in kueue.evictions else None,
            90,
            "recoveryTimeout to evict the Job",
        )
        assert (evicted["status"], evicted["reason"]) == ("True", PODS_READY_TIMEOUT)
        assert evicted["message"] == f"Exceeded the PodsReady timeout ml/{name}"
        requeued = kueue.condition(name, "Requeued")
        assert (requeued["status"], requeued["reason"]) == ("False", PODS_READY_TIMEOUT)
        stats = kueue.workload(name)["status"]["schedulingStats"]["evictions"]
        assert stats == [{"reason": PODS_READY_TIMEOUT, "underlyingCause": WAIT_FOR_RECOVERY, "count": 1}]
        assert real_cluster.get("jobs", name)["spec"]["suspend"] is True
        real_cluster.wait(lambda: not real_cluster.items("pods", rendered.label_selector), 60, "the evicted pods to go")
        real_cluster.wait(
            lambda: any("was evicted (suspended again, its pods deleted)" in x for x in lines),
            30,
            "the watcher to say the Job was evicted",
        )
        assert not done, done and done[0].summary()
        # the nodes healed: requeued after the backoff, admitted again, both pods start (a
        # machine loaded past a timeout may evict the healthy gang too: it is admitted again)
        real_cluster.server.node(other, "slow-pulls", seconds=0)
        real_cluster.server.node(drained, "heal")
        for _ in range(3):
            evictions = len(kueue.evictions)
            real_cluster.wait(
                lambda: (kueue.condition(name, "Requeued") or {}).get("reason") == "BackoffFinished",
                60,
                "the requeuing backoff to pass",
            )
            kueue.admit(name)
            real_cluster.wait(lambda: done or len(kueue.evictions) > evictions, 300, "the step to end or be evicted")
            if done:
                break
        runner.join(60)
        assert done, ("JobGang did not return", kueue.workload(name), lines[-40:])
        result = done[0]
        assert result.state == "SUCCEEDED", (result.summary(), lines)
        resumed = [x for x in lines if "resumed from step-" in x]
        assert resumed and max(int(x.rsplit("step-", 1)[1]) for x in resumed) >= 3, lines
        assert real_cluster.get("jobs", name)["status"]["failed"] == 0  # neither the drain nor the eviction counted
        count = len(kueue.evictions)  # 1, unless the loaded machine needed more than a timeout
        assert result.retryable is False and result.attempts == 1
        assert any(
            w.startswith(f"preempted {count + 1} times (1 pod(s) with DisruptionTarget, {count} Kueue eviction(s))")
            for w in result.warnings
        ), result.warnings
    finally:
        kueue.close()


@pytest.mark.slow
def test_the_time_in_the_queue_is_not_counted_against_the_steps_timeout(real_cluster: Cluster, tmp_path: Path) -> None:
    """Kueue behaviours covered: a Job stays suspended until admitted; Kubernetes counts its
    ``activeDeadlineSeconds`` from the (last) resume, i.e. from admission. A step whose
    timeout is 45 s waits 50 s in the queue, then is admitted, runs and succeeds: the wait
    was not counted (docs/kubernetes.md, "Timeouts and the queue")."""
    kueue = Kueue(real_cluster)
    app = checkpointed(tmp_path / "ckpt")
    role = app.roles[0]
    args = list(role.args)
    args[args.index("--steps") + 1] = "4"
    app = specs.AppDef(app.name, roles=[dataclasses.replace(role, args=args)], metadata={"torchstep.timeout": "45"})
    rendered, lines, done, runner = start(real_cluster, app, pod=False, queue="team-a")
    name = rendered.roles[0].name
    assert rendered.roles[0].workload["spec"]["activeDeadlineSeconds"] == 45
    real_cluster.wait(lambda: any("queued" in x for x in lines), 60, "the step to be queued")
    time.sleep(50)  # longer than the step's timeout, in the queue
    assert not done and not real_cluster.items("pods", rendered.label_selector)
    kueue.admit(name)
    runner.join(120)
    assert done, ("JobGang did not return", lines[-40:])
    assert done[0].state == "SUCCEEDED", (done[0].summary(), lines)
    conditions = {c["type"]: c.get("reason") for c in real_cluster.get("jobs", name)["status"]["conditions"]}
    assert "Failed" not in conditions and conditions.get("Complete") == "CompletionsReached", conditions
