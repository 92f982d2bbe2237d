"""The soak job as an Airflow DAG for a real deployment (the ``airflow_scheduler`` surface,
tools/soak/surfaces/airflow_scheduler.py): as tools/soak/airflow_dag.py, but the run's
``SOAK_*`` environment travels in the DAG run's conf (``params.env``, JSON) into the role's
env: the task runs in a process the scheduler's executor starts, which does not inherit the
environment of whoever triggered the run."""

from __future__ import annotations

import json

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
from torchx import specs

from tools.soak import faults
from tools.soak.component import soak

#: The DAG's id and its one task's.
DAG_ID, TASK_ID = "torchstep_soak_scheduler", "soak"


def soak_with_env(env: str = "") -> specs.AppDef:
    """The soak job (2 replicas x 2 processes, REPLICA retries) with more role environment.

    Args:
        env: a JSON object of variables to add to the role's env ("" or a parse-time
            stand-in: none)

    Returns:
        The AppDef.
    """
    app = soak(faults.REPLICAS, faults.NPROC)
    extra = json.loads(env) if env.strip().startswith("{") else {}
    app.roles[0].env.update({str(k): str(v) for k, v in extra.items()})
    return app


with DAG(DAG_ID, schedule=None, params={"log_dir": "", "env": ""}, tags=["torchstep-soak"]) as dag:
    AppDefOperator(
        task_id=TASK_ID,
        app=soak_with_env,
        app_args={"env": "{{ params.env }}"},
        cfg={
            "log_dir": "{{ params.log_dir }}",
            "timeout": faults.RUN_TIMEOUT_S,
            "grace_period": faults.GRACE_S,
        },
    )
