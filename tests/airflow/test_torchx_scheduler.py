"""``torchx run -s airflow`` against a real Airflow (PostgreSQL, api-server, scheduler,
dag-processor, LocalExecutor) with the generic DAG installed by
``python -m torchstep_airflow.torchx_dag``: submit, status, logs, cancel, bad conf."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from netlib import FaultyProxy, free_port
from proclib import procs_with_env, wait_for

pytestmark = pytest.mark.slow

TORCHX = str(Path(sys.executable).with_name("torchx"))
ROOT = Path(__file__).resolve().parents[2]
STEPS = str(ROOT / "tests" / "apps" / "steps.py")


@pytest.fixture(scope="module")
def airflow(torchx_deployment):
    dag_file = torchx_deployment.home / "dags" / "torchstep_torchx.py"
    assert oct(dag_file.stat().st_mode & 0o777) == "0o600"  # written private, as everything we create
    return torchx_deployment


@pytest.fixture()
def runner(tmp_path, monkeypatch):
    from torchx.runner import get_runner

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the records of this test only
    monkeypatch.chdir(ROOT)  # tests/apps components are found from the repository root
    r = get_runner()
    yield r
    r.close()


def _wait_final(runner, handle, timeout=240):
    from torchx.specs import AppState

    final = (AppState.SUCCEEDED, AppState.FAILED, AppState.CANCELLED)
    return wait_for(lambda: (s := runner.status(handle)) is not None and s.state in final and s, timeout, handle, 1)


def test_echo_runs_as_a_dag_run_of_the_generic_dag_with_logs_and_status(airflow, runner):
    from torchx.specs import AppState

    handle = runner.run_component(
        "utils.echo", ["--msg", "hi-$(id)-{{ ds }}"], scheduler="airflow", cfg={"endpoint": airflow.url}
    )
    app_id = handle.rsplit("/", 1)[1]
    assert app_id.startswith("torchstep_torchx:echo-")
    status = _wait_final(runner, handle)
    assert status.state == AppState.SUCCEEDED, status
    assert status.ui_url.startswith(airflow.url + "/dags/torchstep_torchx/runs/")
    lines = list(runner.log_lines(handle, "echo", 0))
    # the argument reached the process as data: no shell, no Jinja rendering
    assert any("[echo/0] hi-$(id)-{{ ds }}" in line for line in lines), lines[-20:]
    assert all(line.endswith("\n") for line in lines)
    assert not [line for line in lines if line.startswith("[torchstep-agent ") and " INFO] " in line]  # in agent.log
    run = airflow.call("GET", f"/api/v2/dags/torchstep_torchx/dagRuns/{app_id.split(':', 1)[1]}")
    assert run["conf"]["app"]["roles"][0]["args"] == ["hi-$(id)-{{ ds }}"] and run["conf"]["target"] == "local"
    assert any(a.app_id == app_id and a.state == AppState.SUCCEEDED for a in runner.list("airflow"))

    # status and log from another process (the CLI), through the private record
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run([TORCHX, "status", handle], capture_output=True, text=True, env=env, timeout=60)
    assert "State: SUCCEEDED" in out.stdout, out.stdout + out.stderr
    out = subprocess.run([TORCHX, "log", f"{handle}/echo"], capture_output=True, text=True, env=env, timeout=60)
    assert "hi-$(id)-{{ ds }}" in out.stdout, out.stdout + out.stderr


def test_a_failing_app_is_failed_with_its_root_cause(airflow, runner, tmp_path):
    from torchx.specs import AppState

    handle = runner.run_component(
        f"{STEPS}:flaky",
        ["--marker", str(tmp_path / "m"), "--fail_times", "5", "--max_retries", "1"],
        scheduler="airflow",
        cfg={"endpoint": airflow.url},
    )
    status = _wait_final(runner, handle)
    assert status.state == AppState.FAILED
    assert "root cause" in status.msg and "flaky" in status.msg, status.msg
    lines = "".join(runner.log_lines(handle, "flaky", 0))
    assert "try 1 failed" in lines and "retrying" in lines  # the AppDef's max_retries=1, inside the one task


def test_cancel_marks_the_run_failed_reports_cancelled_and_stops_every_process(airflow, runner):
    from torchx.specs import AppState

    mark = f"airflow-torchx-{uuid.uuid4().hex[:8]}"
    handle = runner.run_component(
        f"{STEPS}:sleeper", ["--mark", mark], scheduler="airflow", cfg={"endpoint": airflow.url}
    )
    wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 3, 180, "the sleeper's processes", 0.5)
    assert runner.status(handle).state == AppState.RUNNING
    runner.cancel(handle)
    status = _wait_final(runner, handle, timeout=120)
    assert status.state == AppState.CANCELLED, status
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 60, "no process of the step left", 0.5)


def test_a_bad_appdef_in_the_conf_fails_the_run_naming_the_field(airflow, runner, monkeypatch):
    bad = {"version": 1, "name": "x", "roles": [{"name": "w", "image": "", "entrypoint": ["sh", "-c", "id"]}]}
    run = airflow.trigger("torchstep_torchx", {"app": bad}, timeout=180)
    assert run["state"] == "failed"
    path = f"/api/v2/dags/torchstep_torchx/dagRuns/{run['dag_run_id']}/taskInstances/app"
    tries = airflow.call("GET", f"{path}/tries")["task_instances"]
    assert len(tries) == 1  # not retried
    # what `torchx log` shows of it: the exception with the field and the fix (a run triggered
    # elsewhere: no record here, the endpoint comes from the environment)
    monkeypatch.setenv("TORCHSTEP_AIRFLOW_ENDPOINT", airflow.url)
    text = "".join(runner.log_lines(f"airflow://torchx/torchstep_torchx:{run['dag_run_id']}", "w", 0))
    assert "AirflowFailException: torchstep: conf['app'].roles[0].entrypoint: must be a string" in text, text[-3000:]


def test_submit_errors_name_the_option_and_the_fix(airflow, runner):
    with pytest.raises(Exception, match=r"cfg\['endpoint'\].*fix: -cfg endpoint="):
        runner.dryrun_component("utils.echo", ["--msg", "x"], scheduler="airflow", cfg={})
    with pytest.raises(Exception, match="not deployed.*torchstep_airflow.torchx_dag"):
        runner.run_component(
            "utils.echo", ["--msg", "x"], scheduler="airflow", cfg={"endpoint": airflow.url, "queue": "gpu"}
        )
    with pytest.raises(Exception, match="cannot reach the Airflow API"):
        runner.run_component(
            "utils.echo", ["--msg", "x"], scheduler="airflow", cfg={"endpoint": f"http://127.0.0.1:{free_port()}"}
        )


def test_a_busy_api_and_a_lost_answer_neither_fail_nor_repeat_a_submission(airflow, runner):
    from torchx.specs import AppState

    proxy = FaultyProxy(airflow.url)  # between the scheduler and the real api-server
    try:
        proxy.busy(1, retry_after="1")  # 503: waited for
        proxy.lose_answer("POST", r"/dagRuns$")  # the DAG run is made, its answer never arrives
        handle = runner.run_component("utils.echo", ["--msg", "once"], scheduler="airflow", cfg={"endpoint": proxy.url})
        dag_run_id = handle.rsplit(":", 1)[1]
        assert proxy.log[0][2] == "busy"
        posts = [what for method, path, what in proxy.log if method == "POST" and path.endswith("/dagRuns")]
        posts = [what for what in posts if what != "503"]  # the real api-server's own busy answers, waited for
        assert posts[0].startswith("answer 2") and posts[0].endswith(" lost") and posts[1:] == ["409"]
        runs = airflow.call("GET", "/api/v2/dags/torchstep_torchx/dagRuns?limit=1000")["dag_runs"]
        assert [r["dag_run_id"] for r in runs].count(dag_run_id) == 1  # the retry made no second run
        assert _wait_final(runner, handle).state == AppState.SUCCEEDED
    finally:
        proxy.close()
