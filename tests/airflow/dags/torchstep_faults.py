"""DAGs whose torchstep tasks fail on purpose (tests/airflow): retries by Airflow, a
non-retryable error, an execution timeout, and a step that always fails."""

import datetime
import os

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
from torchx import specs

FAULTY = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "apps", "faulty.py")


def faulty(mode: str, state_dir: str = "", times: int = 1, max_retries: int = 0, nproc: int = 1) -> specs.AppDef:
    """A step running apps/faulty.py under the agent (APPLICATION retries, 1 s apart).

    Args:
        mode: flaky, non_retryable, hang or fail
        state_dir: directory shared by every try
        times: failures before success (flaky)
        max_retries: retries of the whole step by Airflow
        nproc: worker processes
    """
    role = specs.Role(
        "faulty",
        image="",
        entrypoint="python",
        args=[FAULTY, mode, state_dir, str(times)],
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"nproc_per_node": nproc, "retry_delay": 1}},
    )
    return specs.AppDef(f"faulty-{mode}", roles=[role])


STATE = "{{ params.state_dir }}"

with DAG("torchstep_faults", schedule=None, params={"state_dir": ""}, tags=["torchstep-test"]) as faults:
    AppDefOperator(task_id="flaky", app=faulty, app_args={"mode": "flaky", "state_dir": STATE, "max_retries": 1})
    AppDefOperator(
        task_id="non_retryable", app=faulty, app_args={"mode": "non_retryable", "state_dir": STATE, "max_retries": 2}
    )
    AppDefOperator(
        task_id="hang",
        app=faulty,
        app_args={"mode": "hang", "state_dir": STATE, "nproc": 2},
        execution_timeout=datetime.timedelta(seconds=15),
    )

with DAG("torchstep_failing", schedule=None, params={"state_dir": ""}, tags=["torchstep-test"]) as failing:
    AppDefOperator(task_id="always_fails", app=faulty, app_args={"mode": "fail", "state_dir": STATE, "max_retries": 1})

with DAG("torchstep_hang", schedule=None, params={"state_dir": ""}, tags=["torchstep-test"]) as hang:
    AppDefOperator(task_id="hang", app=faulty, app_args={"mode": "hang", "state_dir": STATE, "nproc": 2})


def missing_script(path: str) -> specs.AppDef:
    """A step whose script does not exist: python says so on stderr and exits 2 (no traceback).

    Args:
        path: the script that is not there
    """
    return specs.AppDef("missing", roles=[specs.Role("trainer", image="", entrypoint="python", args=[path])])


with DAG("torchstep_missing_script", schedule=None, params={"state_dir": ""}, tags=["torchstep-test"]) as missing:
    AppDefOperator(task_id="missing", app=missing_script, app_args={"path": STATE + "/missing.py"})
