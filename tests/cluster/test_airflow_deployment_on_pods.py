"""Airflow's real deployment on the one-machine cluster's real pods (issue 35 item 2):
PostgreSQL + api-server + scheduler (LocalExecutor) + dag-processor + triggerer, as
tests/airflow/conftest.py's ``Deployment`` starts them, run the DAGs of
tests/cluster/apps/airflow_pods_dag.py, whose ``AppDefOperator(target="kubernetes")`` is a 2x2
gloo gang (2 pods x 2 ranks that all-reduce) reaching the cluster through Airflow's default
kubernetes connection:

- a run succeeds with every rank's lines once in the task's log, one Job, nothing left;
- the task process SIGKILLed mid-run: Airflow's retry reattaches to the same Job (by the uid
  in the task state store) and resumes the log at the saved cursor;
- ``deferrable=True``: the task waits in the triggerer (DEFERRED, no task process) while the
  pods train, then resumes in a worker and succeeds;
- a 1-role, 1-replica app (the KubernetesPodOperator path) whose task process is SIGKILLed
  mid-run: the retry reattaches to the same pod (by the uid a try recorded) and reads its
  result through the XCom sidecar.

The Airflow processes run on this machine, not in pods (the pods' network namespaces cannot
reach the test's API server on the loopback). One deployment and one cluster serve the module;
each run names its objects apart and each test checks that nothing of it is left.

Found here, not understood yet: in 2 of 7 runs of the deferred test (both times run after the
others), the trigger's ``KubernetesHook`` got no kubeconfig from
``kubernetes_default`` ("Invalid kube-config file. No configuration found." every poll; the
provider's hook turns a failed connection lookup into an empty connection) until the
trigger's 300 s of API patience handed the run back to a worker, while the workers read the
connection. The deferred test then fails with the trigger's own log in its message.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from proclib import airflow_task_process

from cluster.harness import REPO, Cluster
from cluster.test_adapters_on_pods import Seen, nothing_left, rank_lines, saved_lines

DAG_FILE = Path(__file__).resolve().parent / "apps" / "airflow_pods_dag.py"

# a deployment start and three 2x2 gangs: minutes on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def every_line(steps: int) -> list[tuple[int, int]]:
    """Each ``(rank, step)`` of a 2x2 gang that ran ``steps`` steps, sorted."""
    return [(r, s) for r in range(4) for s in range(steps)]


def airflow_harness() -> Any:
    """tests/airflow/conftest.py as a module: its ``Deployment``, without a second copy."""
    spec = importlib.util.spec_from_file_location(
        "_torchstep_airflow_harness", REPO / "tests" / "airflow" / "conftest.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def deployment(module_cluster: Cluster) -> Iterator[Any]:
    """The module's deployment (with a triggerer), its dags folder holding only
    airflow_pods_dag.py, its ``kubernetes_default`` connection naming the cluster."""
    pytest.importorskip("airflow.providers.cncf.kubernetes")
    harness = airflow_harness()
    if harness.postgres_bin() is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the deployment tests: PostgreSQL is not installed (make system-deps)")
        pytest.skip("PostgreSQL is not installed (make system-deps installs it)")
    d = harness.Deployment()
    for link in (d.home / "dags").iterdir():  # the suite's other DAGs: parse time for nothing here
        link.unlink()
    (d.home / "dags" / DAG_FILE.name).symlink_to(DAG_FILE)
    cwd = os.getcwd()
    os.chdir(REPO)  # the components' processes inherit it: TorchX finds gang.py's script from the root
    try:
        d.start()
        extra = {"kube_config_path": str(module_cluster.kubeconfig), "namespace": module_cluster.namespace}
        d.call(
            "POST",
            "/api/v2/connections",
            {"connection_id": "kubernetes_default", "conn_type": "kubernetes", "extra": json.dumps(extra)},
        )
        # the triggerer once the connection exists (a deployer's order; the first trigger reads it)
        with open(d.home / "triggerer.log", "wb") as log:
            d.procs["triggerer"] = subprocess.Popen(
                [harness.AIRFLOW, "triggerer"], env=d.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        os.chdir(cwd)
        d.wait(lambda: triggerer_healthy(d), 180, "the triggerer to be healthy")
        yield d
    finally:
        os.chdir(cwd)
        d.stop()
        shutil.rmtree(d.home, ignore_errors=True)


def trigger_said(d: Any) -> str:
    """What torchstep's triggers logged (their own log files, beside the task logs)."""
    lines = [
        line
        for f in sorted((d.home / "logs").rglob("*.trigger.*"))
        for line in f.read_text(errors="replace").splitlines()
        if "torchstep" in line
    ]
    return "\n".join(lines[:5] + ["..."] + lines[-5:])


def triggerer_healthy(d: Any) -> bool:
    try:
        return d.call("GET", "/api/v2/monitor/health").get("triggerer", {}).get("status") == "healthy"  # type: ignore[no-any-return]
    except (OSError, AssertionError):
        return False


def task_path(run: dict[str, Any], dag_id: str) -> tuple[str, str]:
    """The REST paths of the run and of its task instance ``train``."""
    path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}"
    return path, f"{path}/taskInstances/train"


def finished(d: Any, path: str, timeout: float = 400) -> dict[str, Any]:
    """The run once it succeeded or failed."""

    def done() -> dict[str, Any] | None:
        r = d.call("GET", path)
        return r if r["state"] in ("success", "failed") else None

    return d.wait(done, timeout, f"the run {path} to finish", interval=1)  # type: ignore[no-any-return]


def log_of(d: Any, ti: str, try_number: int) -> str:
    """The events of one try's task log, a line each (what the task's log page shows)."""
    log = d.call("GET", f"{ti}/logs/{try_number}?full_content=true")
    return "\n".join(str(e.get("event", "")) if isinstance(e, dict) else str(e) for e in log["content"])


def result_of(d: Any, ti: str) -> dict[str, Any]:
    return d.call("GET", f"{ti}/xcomEntries/return_value?deserialize=true")["value"]  # type: ignore[no-any-return]


def test_a_2x2_gang_on_real_pods_succeeds_in_the_deployment(deployment: Any, module_cluster: Cluster) -> None:
    with Seen(module_cluster) as seen:
        run = deployment.start_run("torchstep_pods_gang")
        path, ti = task_path(run, "torchstep_pods_gang")
        done = finished(deployment, path)
    text = log_of(deployment, ti, 1)
    assert done["state"] == "success", text[-4000:]
    result = result_of(deployment, ti)
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}
    assert [r["replica_id"] for r in result["replicas"]] == [0, 1]
    assert sorted(rank_lines(text)) == every_line(3), text[-4000:]  # every rank's lines, once, in the task's log
    assert len(seen.jobs) == 1 and seen.complete == set(seen.jobs)  # one Job, completed by its pods
    assert len(seen.pods) == 2 and seen.processes >= 2  # two real pods, no replacement
    nothing_left(module_cluster)


def test_a_sigkilled_task_process_is_retried_and_the_retry_reattaches_to_the_same_job(
    deployment: Any, module_cluster: Cluster
) -> None:
    steps = 60
    with Seen(module_cluster) as seen:
        run = deployment.start_run("torchstep_pods_durable")
        path, ti = task_path(run, "torchstep_pods_durable")

        def running() -> dict[str, Any] | None:  # try 1 runs and its Job exists
            t = deployment.call("GET", ti)
            return t if t["state"] == "running" and seen.jobs else None

        first = deployment.wait(running, 300, "try 1 to create its Job", interval=0.5)
        assert first["try_number"] == 1
        pid = deployment.wait(lambda: airflow_task_process(first["id"]), 60, "the task process of try 1")
        # kill it once it saved a log position past some of both pods' training lines
        module_cluster.wait(
            lambda: len({r // 2 for r, _ in saved_lines(module_cluster)}) == 2,
            180,
            "try 1 to save a log position past both pods' training lines",
        )
        os.kill(pid, signal.SIGKILL)  # the worker dies (node lost, OOM): nothing cleans up
        killed = time.monotonic()
        time.sleep(0.5)  # a cursor patch already sent is applied before it is read
        before = saved_lines(module_cluster)
        (job_uid,) = seen.jobs
        assert module_cluster.pod_processes()  # the pods train on without their watcher
        deployment.wait(
            lambda: deployment.call("GET", ti)["try_number"] == 2, 400, "Airflow to start try 2", interval=0.5
        )
        retried = time.monotonic()
        done = finished(deployment, path)
    print(
        f"try 2 started {retried - killed:.1f} s after the kill, the run ended {time.monotonic() - retried:.1f} s later"
    )
    tries = deployment.call("GET", f"{ti}/tries")["task_instances"]
    first_text, second_text = log_of(deployment, ti, 1), log_of(deployment, ti, 2)
    assert done["state"] == "success", second_text[-4000:]
    assert [t["try_number"] for t in tries] == [1, 2]  # Airflow's retry, once
    assert "attached to the running Job" in second_text, second_text[-4000:]
    assert set(seen.jobs) == {job_uid} and seen.complete == {job_uid}  # the one Job, run to its end
    assert len(seen.pods) == 2  # never a second set of pods
    once, again = rank_lines(first_text), rank_lines(second_text)
    assert len(again) == len(set(again)) and len(once) == len(set(once))
    assert before <= set(once) and not before & set(again), sorted(before & set(again))  # resumed at the cursor
    assert sorted(set(once) | set(again)) == every_line(steps)  # nothing lost
    result = result_of(deployment, ti)
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}
    print(f"Airflow retry reattached: try 2 skipped {len(before)} lines, printed {len(again)}")
    nothing_left(module_cluster)


def test_a_deferrable_task_waits_in_the_triggerer_while_the_pods_train(
    deployment: Any, module_cluster: Cluster
) -> None:
    seen_while_deferred: list[tuple[int, bool]] = []  # (pod processes, a task process existed)
    states: list[str] = []
    with Seen(module_cluster) as seen:
        run = deployment.start_run("torchstep_pods_deferred")
        path, ti = task_path(run, "torchstep_pods_deferred")
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            t = deployment.call("GET", ti)
            if not states or states[-1] != t["state"]:
                states.append(t["state"])
            if t["state"] == "deferred":
                seen_while_deferred.append(
                    (len(module_cluster.pod_processes()), airflow_task_process(t["id"]) is not None)
                )
            if deployment.call("GET", path)["state"] in ("success", "failed"):
                break
            time.sleep(0.5)
        done = finished(deployment, path, timeout=30)
    text = log_of(deployment, ti, 1)
    assert done["state"] == "success", (states, text[-4000:])
    # the pods trained while the task was deferred, with no task process holding a worker slot
    assert any(procs and not worker for procs, worker in seen_while_deferred), (states, seen_while_deferred)
    assert "deferred" in states and states[-1] == "success", states
    assert "back from the triggerer (succeeded)" in text, trigger_said(deployment)
    assert deployment.call("GET", ti)["try_number"] == 1  # resumed, not retried
    result = result_of(deployment, ti)
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"sum": 10, "world": 4}
    assert sorted(rank_lines(text)) == every_line(20), text[-4000:]  # each line once, after the resume
    assert len(seen.jobs) == 1 and seen.complete == set(seen.jobs) and len(seen.pods) == 2
    nothing_left(module_cluster)


def test_a_sigkilled_task_process_on_the_pod_path_is_retried_and_reattaches_to_the_same_pod(
    deployment: Any, module_cluster: Cluster
) -> None:
    dag_id = "torchstep_pods_kpo_durable"
    with Seen(module_cluster) as seen:
        run = deployment.start_run(dag_id)
        path, ti = task_path(run, dag_id)

        def running() -> dict[str, Any] | None:  # try 1 runs and its pod's step prints
            t = deployment.call("GET", ti)
            return t if t["state"] == "running" and seen.pods and module_cluster.pod_processes() else None

        first = deployment.wait(running, 300, "try 1's pod to run", interval=0.5)
        assert first["try_number"] == 1
        pid = deployment.wait(lambda: airflow_task_process(first["id"]), 60, "the task process of try 1")
        os.kill(pid, signal.SIGKILL)  # the worker dies mid-step: nothing deletes the pod
        (pod_uid,) = seen.pods
        assert module_cluster.pod_processes()  # the pod runs on without its watcher
        deployment.wait(
            lambda: deployment.call("GET", ti)["try_number"] == 2, 400, "Airflow to start try 2", interval=0.5
        )
        done = finished(deployment, path)
    second_text = log_of(deployment, ti, 2)
    assert done["state"] == "success", second_text[-4000:]
    tries = deployment.call("GET", f"{ti}/tries")["task_instances"]
    assert [t["try_number"] for t in tries] == [1, 2]  # Airflow's retry, once
    # reattached, not created: the one pod (seen by uid) ran the step to its end for try 2
    assert set(seen.pods) == {pod_uid}, (seen.pods, second_text[:9000])
    assert "succeeded" in second_text, second_text[-4000:]
    result = result_of(deployment, ti)  # read from the reattached pod through the XCom sidecar
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"answer": 42}, result
    nothing_left(module_cluster)
