"""A real Airflow: PostgreSQL, api-server, scheduler and dag-processor with LocalExecutor.
DAG runs are triggered through the REST API, as a user or a CI system would."""

import urllib.parse

import pytest

pytestmark = pytest.mark.slow


def task_path(run: dict, task_id: str) -> str:
    return (
        f"/api/v2/dags/{run['dag_id']}/dagRuns/{urllib.parse.quote(run['dag_run_id'], safe='')}/taskInstances/{task_id}"
    )


def log_text(deployment, run: dict, task_id: str, try_number: int) -> str:
    log = deployment.call("GET", f"{task_path(run, task_id)}/logs/{try_number}?full_content=true")
    return "\n".join(str(e.get("event", "")) if isinstance(e, dict) else str(e) for e in log["content"])


def test_example_pipeline_succeeds_with_results_in_xcom_and_rank_logs_in_the_task_log(deployment):
    run = deployment.trigger("torchstep_example", {"base_lr": 0.05, "steps": 30}, timeout=300)
    assert run["state"] == "success"
    xcom = deployment.call("GET", f"{task_path(run, 'train')}/xcomEntries/return_value?deserialize=true")
    result = xcom["value"]
    assert result["state"] == "SUCCEEDED" and result["outputs"]["world_size"] == 4
    assert result["outputs"]["steps"] == 30
    log = log_text(deployment, run, "train", 1)
    assert "[trainer/0] trainer train-" in log and "steps on 4 ranks" in log  # rank output in Airflow's task log
    assert "torchstep: trainer replica 1 SUCCEEDED" in log  # the launcher's replica events too


def test_failing_step_is_tried_retries_plus_one_times_and_its_log_shows_the_root_cause(deployment, tmp_path):
    run = deployment.trigger("torchstep_failing", {"state_dir": str(tmp_path)}, timeout=180)
    assert run["state"] == "failed"
    tries = deployment.call("GET", f"{task_path(run, 'always_fails')}/tries")["task_instances"]
    assert [t["try_number"] for t in tries] == [1, 2]  # max_retries=1 (APPLICATION) -> Airflow retries=1
    assert tries[-1]["state"] == "failed" and tries[-1]["max_tries"] == 1
    for n in (1, 2):
        log = log_text(deployment, run, "always_fails", n)
        assert "[faulty/0]" in log and "RuntimeError: this step always fails" in log
        assert "root cause: rank 0 (faulty replica 0)" in log


def test_marking_a_running_task_failed_stops_every_process_of_the_step(deployment, tmp_path):
    run = deployment.start_run("torchstep_hang", {"state_dir": str(tmp_path)})
    pid_files = deployment.wait(lambda: len(list(tmp_path.glob("pids.*"))) == 2, 120, "both workers to start")
    assert pid_files
    pids = [int(p) for f in tmp_path.glob("pids.*") for p in f.read_text().split()]
    deployment.call("PATCH", f"{task_path(run, 'hang')}", {"new_state": "failed"})
    deployment.wait(lambda: not [p for p in pids if alive(p)], 60, "the step's processes to stop")
    ti = deployment.call("GET", task_path(run, "hang"))
    assert ti["state"] == "failed"
    log = log_text(deployment, run, "hang", 1)
    assert "stopping the step (task killed)" in log
    for rank in (0, 1):  # every rank's output, prefixed, in Airflow's task log
        assert f"[faulty/{rank}] faulty worker rank {rank} mode hang" in log


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in next((x for x in f if x.startswith("State:")), "").lower()
    except OSError:
        return False


def test_stopping_airflow_leaves_no_process_behind(deployment):
    assert deployment.stop() == []
