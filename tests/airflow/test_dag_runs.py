"""torchstep tasks in real Airflow DAG runs (``dag.test()``: the task runner, XCom, retries
and timeouts of Airflow itself, with real agents and real torch.distributed workers)."""

import os
import time

import pytest
from torchstep.plan.names import run_name
from torchstep_airflow import task_run_id


@pytest.fixture(scope="module")
def example_run(dag_tester):
    return dag_tester.run("torchstep_example", {"base_lr": 0.05, "steps": 30})


@pytest.fixture(scope="module")
def faults(dag_tester, tmp_path_factory):
    state = tmp_path_factory.mktemp("faults")
    summary = dag_tester.run("torchstep_faults", {"state_dir": str(state)})
    summary["state_dir"] = state
    return summary


def test_pipeline_passes_results_along_and_trains_on_2_replicas_x_2_processes(example_run):
    tasks = example_run["tasks"]
    assert {t: v["state"] for t, v in tasks.items()} == {
        "prepare": "success",
        "train": "success",
        "evaluate": "success",
    }
    prepare = tasks["prepare"]["xcom"]
    assert prepare["outputs"] == {"lr": 0.2, "steps": 30}  # templated app_args ({{ params.* }}) were rendered
    train = tasks["train"]["xcom"]
    assert train["state"] == "SUCCEEDED" and train["schema"] == 1
    assert tasks["train"]["max_tries"] == 1  # max_retries=1, APPLICATION policy -> Airflow retries=1
    assert sorted((r["role"], r["replica_id"]) for r in train["replicas"]) == [("trainer", 0), ("trainer", 1)]
    assert sorted(rk["rank"] for rep in train["replicas"] for rk in rep["ranks"]) == [0, 1, 2, 3]
    assert train["outputs"]["world_size"] == 4 and train["outputs"]["steps"] == 30  # read from prepare's XCom
    # the app id (${app_id}) is derived from the Airflow run and try
    assert train["app_id"] == run_name("train", task_run_id("torchstep_example", example_run["run_id"], "train", 1))
    evaluate = tasks["evaluate"]["xcom"]  # @task.torchstep, fed by train's outputs
    assert evaluate["state"] == "SUCCEEDED" and evaluate["outputs"]["loss_ratio"] < 0.5


def test_every_rank_output_reaches_the_task_log_prefixed(example_run, faults):
    assert "steps on 4 ranks" in example_run["output"]
    assert "[trainer/0] trainer train-" in example_run["output"]
    for rank in (0, 1):  # both workers of the hang task
        assert f"[faulty/{rank}] faulty worker rank {rank} mode hang" in faults["output"]


def test_a_worker_that_fails_once_is_retried_by_airflow_exactly_once(faults):
    flaky = faults["tasks"]["flaky"]
    assert flaky["state"] == "success"
    assert flaky["try_number"] == 2 and flaky["max_tries"] == 1
    assert flaky["xcom"]["outputs"] == {"failures_before_success": 1}
    assert (faults["state_dir"] / "flaky.count").read_text() == "1"


def test_non_retryable_error_fails_the_task_without_any_retry(faults):
    task = faults["tasks"]["non_retryable"]
    assert task["max_tries"] == 2  # Airflow would have retried twice...
    assert (task["state"], task["try_number"]) == ("failed", 1)  # ...but did not
    result = task["xcom"]
    assert result["retryable"] is False and result["state"] == "FAILED"
    assert "retrying cannot help" in result["root_cause"]["message"]
    assert "not retryable" in faults["output"]


def test_the_task_log_and_exception_name_the_root_cause_by_its_last_meaningful_line(dag_tester, tmp_path):
    """A missing script: the task's error says python's "can't open file", not "exited with code 2"."""
    summary = dag_tester.run("torchstep_missing_script", {"state_dir": str(tmp_path)})
    assert summary["tasks"]["missing"]["state"] == "failed"
    said = [
        x
        for x in summary["output"].splitlines()
        if "FAILED (exit code 2); root cause: rank 0 (trainer replica 0): " in x
    ]
    assert said and all(f"can't open file '{tmp_path}/missing.py'" in x for x in said), summary["output"][-3000:]
    assert any("AirflowException: torchstep: " in x for x in said)  # the exception, not only the log line


def test_execution_timeout_leaves_no_process_behind(faults):
    task = faults["tasks"]["hang"]
    assert (task["state"], task["try_number"]) == ("failed", 1)
    assert task["xcom"]["state"] == "CANCELLED"  # the stopped run's result is still reported
    pids = [int(p) for f in faults["state_dir"].glob("pids.*") for p in f.read_text().split()]
    assert len(pids) == 4  # 2 workers and their parents (the agent side)
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if os.path.exists(f"/proc/{p}") and "zombie" not in _state(p)]
        time.sleep(0.2)
    assert alive == []


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((line for line in f if line.startswith("State:")), "").lower()
    except OSError:
        return "zombie"
