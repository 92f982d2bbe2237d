"""The Prefect adapter installs alone (with the newest Prefect its range allows) and
imports without pulling in torch, Airflow or KFP."""

import subprocess
import sys


def test_import_is_light_and_prefect_is_installed():
    code = (
        "import sys, importlib.metadata as md, torchstep_prefect;"
        "bad = sorted(m for m in ('torch', 'airflow', 'kfp') if m in sys.modules);"
        "print(','.join(bad) or 'clean', md.version('prefect'))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == "clean", f"importing torchstep_prefect pulled in: {out[0]}"
    assert int(out[1].split(".")[0]) == 3, f"torchstep-prefect targets Prefect 3, found {out[1]}"


def test_core_plans_for_the_local_target():
    import torchstep

    plan = torchstep.build_plan(torchstep.materialize("utils.sh", ["echo", "a b"]), target="local")
    assert plan.roles[0].argv == ["sh", "-c", "echo 'a b'"]  # torchx quotes each word


def test_app_task_builds_a_prefect_task_with_whatever_prefect_this_environment_has():
    """With the newest Prefect the range allows: the task's parameters, retries from the
    AppDef, the retry condition that refuses a non-retryable failure, the job variables."""
    import pytest
    from prefect.states import Failed
    from prefect.utilities.callables import parameter_schema
    from torchstep_prefect import StepFailed, app_task, job_variables
    from torchx import specs

    echo = app_task("utils.echo")
    assert parameter_schema(echo.fn).properties["msg"]["type"] == "string"
    role = specs.Role(
        "t",
        image="img:1",
        entrypoint="true",
        max_retries=2,
        resource=specs.Resource(cpu=2, gpu=0, memMB=512),
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"retry_delay": 5}},
    )
    t = app_task(specs.AppDef("a", roles=[role]))
    assert t.retries == 2 and t.retry_delay_seconds == [5.0, 5.0]
    refuse = StepFailed("bad input", {"retryable": False})
    assert t.retry_condition_fn(t, None, Failed(data=refuse)) is False
    assert t.retry_condition_fn(t, None, Failed(data=StepFailed("flaky", {"retryable": True}))) is True
    from torchstep import RunError

    kept = RunError("attempt 'x'", "3 failed Jobs of it are still kept; fix: delete them", retryable=False)
    assert t.retry_condition_fn(t, None, Failed(data=kept)) is False  # a RunError that says so: no retry
    assert t.retry_condition_fn(t, None, Failed(data=RunError("Job ml/x", "HTTP 503; fix: retry"))) is True
    assert job_variables(specs.AppDef("a", roles=[role]))["cpu_request"] == "2"
    with pytest.raises(Exception, match="max_retries"):
        app_task(specs.AppDef("a", roles=[role]), retries=7)
