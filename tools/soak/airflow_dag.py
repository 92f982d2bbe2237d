"""The soak job as an Airflow DAG (the ``airflow`` surface, tools/soak/surfaces/airflow.py):
one ``AppDefOperator`` running ``tools/soak/component.py:soak`` (2 replicas x 2 processes,
REPLICA retries: the agents restart, Airflow ``retries`` is 0) on the local target. The run's
log directory comes from the DAG run's conf (``params.log_dir``); its faults and markers
from the environment of the process that runs the task (the step inherits it)."""

from __future__ import annotations

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator

from tools.soak import faults
from tools.soak.component import soak

#: The DAG's id and its one task's.
DAG_ID, TASK_ID = "torchstep_soak", "soak"

with DAG(DAG_ID, schedule=None, params={"log_dir": ""}, tags=["torchstep-soak"]) as dag:
    AppDefOperator(
        task_id=TASK_ID,
        app=soak,
        app_args={"replicas": faults.REPLICAS, "nproc": faults.NPROC},
        cfg={
            "log_dir": "{{ params.log_dir }}",
            "timeout": faults.RUN_TIMEOUT_S,
            "grace_period": faults.GRACE_S,
        },
    )
