"""docs/kubernetes.md's "Running on a real cluster" plan, the rows this machine can execute:
rendered objects (``torchstep.kubernetes.render_app``) run by ``JobGang`` against the
one-machine cluster, whose pods run the embedded agent for real. Each test names its row; its
assertions are the row's "expected" column."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

import torchstep
from torchstep.kubernetes import JobGang, OfficialClient
from torchx import specs

from cluster.harness import Cluster

APPS = Path(__file__).resolve().parents[1] / "apps"
ALLREDUCE = Path(__file__).resolve().parent / "apps" / "allreduce.py"


def run(cluster: Cluster, app: specs.AppDef, **cfg: Any) -> tuple[Any, list[str], Any]:
    """Render ``app`` and run it with JobGang, keeping every object for the assertions."""
    rendered = torchstep.kubernetes.render_app(app, namespace="ml", cfg={"run_id": f"r{uuid.uuid4().hex[:6]}", **cfg})
    kube = OfficialClient.from_config(config_file=str(cluster.kubeconfig), in_cluster=False)
    lines: list[str] = []
    result = JobGang(rendered, kube, on_line=lines.append, poll_interval=0.5, on_finish="keep").run()
    return result, lines, rendered


def flaky(fail_times: int, policy: specs.RetryPolicy, non_retryable: bool = False, replicas: int = 2) -> specs.AppDef:
    """tests/apps/flaky.py: fails its first ``fail_times`` attempts in a pod (marker in its /tmp)."""
    role = specs.Role(
        "w",
        image="unused",
        entrypoint="python",
        args=[str(APPS / "flaky.py"), "/tmp/attempts", str(fail_times), str(non_retryable)],
        num_replicas=replicas,
        max_retries=2,
        retry_policy=policy,
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    )
    return specs.AppDef("flaky", roles=[role])


def job_condition(cluster: Cluster, rendered: Any) -> tuple[str, str]:
    job = cluster.get("jobs", rendered.roles[0].workload["metadata"]["name"])
    c = next(c for c in job["status"]["conditions"] if c["type"] in ("Complete", "Failed") and c["status"] == "True")
    return c["type"], c["reason"]


def pods(cluster: Cluster, rendered: Any) -> list[dict[str, Any]]:
    return cluster.items("pods", rendered.label_selector)


def terminated(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def test_row_2_a_one_replica_echo_pod_succeeds_with_prefixed_logs_and_a_result(real_cluster: Cluster) -> None:
    result, lines, rendered = run(real_cluster, torchstep.materialize("utils.echo", ["--msg", "hello from a pod"]))
    assert rendered.roles[0].kind == "Pod" and result.state == "SUCCEEDED", result.summary()
    assert "[echo/0] hello from a pod" in lines
    (pod,) = pods(real_cluster, rendered)
    assert pod["status"]["phase"] == "Succeeded"
    assert '"state":"SUCCEEDED"' in terminated(pod)["message"]  # the agent's result, as the termination message


def test_rows_3_and_15_a_2x2_ddp_job_forms_one_world_across_two_pods_and_leaves_nothing(real_cluster: Cluster) -> None:
    app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", str(ALLREDUCE)])
    t0 = time.monotonic()
    result, lines, rendered = run(real_cluster, app)
    took = time.monotonic() - t0
    assert result.state == "SUCCEEDED", result.summary()
    reports = sorted(line for line in lines if "allreduce rank=" in line)
    assert len(reports) == 4 and all("world=4 sum=10" in r for r in reports), lines
    assert job_condition(real_cluster, rendered) == ("Complete", "CompletionsReached")
    ordered = sorted(
        pods(real_cluster, rendered),
        key=lambda p: p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"],
    )
    assert len(ordered) == 2 and ordered[0]["spec"]["nodeName"] != ordered[1]["spec"]["nodeName"]
    ip0, ip1 = (p["status"]["podIP"] for p in ordered)
    fqdn0 = rendered.roles[0].rank0_host
    # ranks 0-1 ran in pod 0's network namespace, 2-3 in pod 1's; pod 1 reached pod 0 by its FQDN (cluster DNS)
    assert all(f"ip={ip0} " in r for r in reports[:2]) and all(f"ip={ip1} " in r for r in reports[2:]), reports
    assert all(f"master={fqdn0}" in r for r in reports)
    print(f"2x2 gloo job on the one-machine cluster: {took:.1f} s from create to collected")
    # row 15: deleting by the run's label leaves nothing of it
    selector = rendered.label_selector
    for kind in ("jobs", "pods", "services"):
        real_cluster.api(
            "DELETE", real_cluster.path(kind) + f"?labelSelector={selector}", {"propagationPolicy": "Foreground"}
        )
    real_cluster.wait(
        lambda: not any(real_cluster.items(k, selector) for k in ("jobs", "pods", "services")),
        60,
        "every object of the run to go",
    )


def test_row_5_a_worker_crashing_once_is_restarted_in_place_by_the_agent(real_cluster: Cluster) -> None:
    result, lines, rendered = run(real_cluster, flaky(1, specs.RetryPolicy.REPLICA))
    assert result.state == "SUCCEEDED" and result.restarts >= 1, result.summary()
    assert job_condition(real_cluster, rendered) == ("Complete", "CompletionsReached")
    created = pods(real_cluster, rendered)
    assert len(created) == 2  # no new pod: the agent restarted the worker group inside it
    assert all(p["status"]["containerStatuses"][0]["restartCount"] == 0 for p in created)
    assert any("attempt 2: ok" in line for line in lines), lines


def test_row_6_a_worker_that_always_fails_fails_the_job_after_the_agents_restarts(real_cluster: Cluster) -> None:
    result, lines, rendered = run(real_cluster, flaky(99, specs.RetryPolicy.REPLICA, replicas=1))
    assert result.state == "FAILED" and result.restarts == 2, result.summary()
    assert job_condition(real_cluster, rendered) == ("Failed", "PodFailurePolicy")
    assert len(pods(real_cluster, rendered)) == 1  # no replacement pod
    assert any("attempt 3: failing on purpose" in line for line in lines), lines


def test_row_9_non_retryable_error_fails_the_job_at_once(real_cluster: Cluster) -> None:
    result, _, rendered = run(real_cluster, flaky(0, specs.RetryPolicy.REPLICA, non_retryable=True, replicas=1))
    assert result.state == "FAILED" and result.exit_code == 82 and result.restarts == 0, result.summary()
    assert result.retryable is False
    assert job_condition(real_cluster, rendered) == ("Failed", "PodFailurePolicy")
    (pod,) = pods(real_cluster, rendered)
    assert terminated(pod)["exitCode"] == 82


def test_row_10_application_retries_leave_the_job_one_try(real_cluster: Cluster) -> None:
    result, _, rendered = run(real_cluster, flaky(99, specs.RetryPolicy.APPLICATION))
    assert rendered.roles[0].workload["spec"]["backoffLimit"] == 0
    assert result.state == "FAILED" and result.retryable is True, result.summary()  # the orchestrator retries
    assert job_condition(real_cluster, rendered) == ("Failed", "BackoffLimitExceeded")
    indexes = [
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods(real_cluster, rendered)
    ]
    assert sorted(indexes) == sorted(set(indexes))  # the first failure failed the Job: no pod was replaced


def test_row_12_the_active_deadline_stops_the_agent_with_sigterm(real_cluster: Cluster) -> None:
    role = specs.Role(
        "s",
        image="unused",
        entrypoint="python",
        args=[str(APPS / "sleeper.py"), "120"],
        num_replicas=2,
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    )
    t0 = time.monotonic()
    result, lines, rendered = run(real_cluster, specs.AppDef("sleepy", roles=[role]), active_deadline=8)
    assert time.monotonic() - t0 < 90
    assert job_condition(real_cluster, rendered) == ("Failed", "DeadlineExceeded")
    assert result.state == "FAILED", result.summary()
    events = real_cluster.items("events")
    ends = [e["message"] for e in events if e["reason"] == "Failed" and e["involvedObject"]["kind"] == "Pod"]
    assert len(ends) == 2 and all("exited 143" in m for m in ends), ends  # the agents forwarded SIGTERM and exited 143


def test_rows_7_and_8_a_drained_then_killed_replica_is_replaced_and_the_job_completes(real_cluster: Cluster) -> None:
    role = specs.Role(
        "t",
        image="unused",
        entrypoint="python",
        args=[str(Path(__file__).resolve().parent / "apps" / "steps.py"), "--steps", "40", "--stop-s", "2"],
        num_replicas=2,
        max_retries=2,
        retry_policy=specs.RetryPolicy.REPLICA,
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    )
    rendered = torchstep.kubernetes.render_app(
        specs.AppDef("steps", roles=[role]), namespace="ml", cfg={"run_id": f"r{uuid.uuid4().hex[:6]}"}
    )
    kube = OfficialClient.from_config(config_file=str(real_cluster.kubeconfig), in_cluster=False)
    lines: list[str] = []
    gang = JobGang(rendered, kube, on_line=lines.append, poll_interval=0.5, on_finish="keep")
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(gang.run()), daemon=True)
    runner.start()

    def index_1() -> dict[str, Any] | None:
        return next(
            (
                p
                for p in pods(real_cluster, rendered)
                if p["status"]["phase"] == "Running"
                and "deletionTimestamp" not in p["metadata"]
                and p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"
            ),
            None,
        )

    def steps_seen() -> int:
        return sum("step 3 world 2" in line for line in lines)

    real_cluster.wait(lambda: steps_seen() >= 1, 120, "the 2-replica job to train")
    first = index_1()
    assert first is not None
    real_cluster.server.node(first["spec"]["nodeName"], "drain")  # row 7
    real_cluster.wait(lambda: steps_seen() >= 2, 180, "the survivors and the replacement to train again")
    second = real_cluster.wait(index_1, 30, "the replacement of index 1")
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert second["spec"]["nodeName"] != first["spec"]["nodeName"]  # the drained node is cordoned
    real_cluster.server.node("", "signal-pod", pod=second["metadata"]["name"], signal=9)  # row 8
    runner.join(300)
    assert done, "JobGang did not return"
    result = done[0]
    assert result.state == "SUCCEEDED", result.summary()
    assert job_condition(real_cluster, rendered) == ("Complete", "CompletionsReached")
    killed = real_cluster.get("pods", second["metadata"]["name"])
    assert terminated(killed)["exitCode"] == 137  # counted (the failure policy's Count rule), then replaced
    assert any(w.startswith("preempted 1 time (1 pod(s) with DisruptionTarget") for w in result.warnings)
    final = [p for p in pods(real_cluster, rendered) if p["status"]["phase"] == "Succeeded"]
    counts = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["metadata"]["annotations"][
            "batch.kubernetes.io/job-index-failure-count"
        ]
        for p in final
    }
    # pod 0 never replaced; index 1 replaced once per fault, but only the kill counted (a drain is a
    # preemption: the policy ignores DisruptionTarget, its own budget counts it)
    assert counts == {"0": "0", "1": "1"}
    events = real_cluster.items("events")
    assert any(e["reason"] == "Evicted" and e["involvedObject"]["name"] == first["metadata"]["name"] for e in events)
    assert steps_seen() >= 3 and any("step 39 world 2" in line for line in lines)


def test_row_13_rendered_mounts_and_shm_size_are_what_the_pod_sees(real_cluster: Cluster, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("dataset\n")
    script = (
        "cat /data/in.txt; touch /data/x 2>/dev/null || echo data-read-only; echo kept > /ckpt/step && echo ckpt-rw;"
        " df -k /dev/shm | tail -1"
    )
    role = specs.Role(
        "m",
        image="unused",
        entrypoint="bash",
        args=["-c", script],
        mounts=[
            specs.BindMount(src_path=str(data), dst_path="/data", read_only=True),
            specs.VolumeMount(src="ckpt", dst_path="/ckpt"),
        ],
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    )
    result, lines, rendered = run(real_cluster, specs.AppDef("mounts", roles=[role]), shm_size="64Mi")
    assert result.state == "SUCCEEDED", result.summary()
    text = "\n".join(lines)
    assert "dataset" in text and "data-read-only" in text and "ckpt-rw" in text, text
    assert not (data / "x").exists()
    shm = next(line for line in lines if "/dev/shm" in line)
    assert int(shm.split()[-5]) == 64 * 1024, shm  # 1K-blocks of the rendered sizeLimit
    assert (real_cluster.root / "pvc" / "ml" / "ckpt" / "step").read_text() == "kept\n"  # the claim's directory


def test_row_4_pod_1_waits_for_a_pod_0_whose_image_pull_is_slow(real_cluster: Cluster) -> None:
    real_cluster.server.node("node-0", "slow-pulls", seconds=PULL_S)  # pod 0 lands there (the first, emptiest node)
    app = torchstep.materialize("dist.ddp", ["-j", "2x1", "--script", str(ALLREDUCE)])
    result, lines, rendered = run(real_cluster, app)
    assert result.state == "SUCCEEDED", result.summary()
    assert not [line for line in lines if "timed out" in line], lines
    assert job_condition(real_cluster, rendered) == ("Complete", "CompletionsReached")
    by_index = {
        p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p
        for p in pods(real_cluster, rendered)
    }
    assert by_index["0"]["spec"]["nodeName"] == "node-0"
    started = {i: terminated(p)["startedAt"] for i, p in by_index.items()}
    assert started["1"] < started["0"], started  # pod 1's agent ran first and waited
    pulls = [e for e in real_cluster.items("events") if e["reason"] == "Pulling"]
    assert [e["involvedObject"]["name"] for e in pulls] == [by_index["0"]["metadata"]["name"]]


PULL_S = 15  # longer than an agent takes to start here (the 60 s TCPStore read timeout would cost a minute more)
