"""DAGs of tests/cluster/test_airflow_deployment_on_pods.py: ``AppDefOperator(target="kubernetes")``
of gang.py's 2x2 gloo gang, run by a real Airflow deployment on the one-machine cluster's pods.
The cluster is Airflow's default kubernetes connection (``kubernetes_default``, made by the test
through the REST API, as a deployer makes it), for the workers and the triggerer alike.

Linked into the deployment's dags folder: ``__file__`` resolves to this directory.
"""

from pathlib import Path

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator

GANG = f"{Path(__file__).resolve().parent / 'gang.py'}:allreduce_steps"
CFG = {"namespace": "ml"}
FAST = {"poll_interval": 0.5}  # the Job's state read every 0.5 s (default 2 s): a shorter test

with DAG("torchstep_pods_gang", schedule=None, tags=["torchstep-test"]):
    AppDefOperator(
        task_id="train", app=GANG, app_args={"steps": 3}, target="kubernetes", cfg=CFG, kubernetes_kwargs=FAST
    )

# trains for ~30 s: long enough for the test to SIGKILL the task process mid-run; one retry, 1 s later
# (unset, Airflow waits its default 300 s)
with DAG("torchstep_pods_durable", schedule=None, tags=["torchstep-test"]):
    AppDefOperator(
        task_id="train",
        app=GANG,
        app_args={"steps": 60, "interval": 0.5, "max_retries": 1, "retry_delay": 1},
        target="kubernetes",
        cfg=CFG,
        kubernetes_kwargs=FAST,
    )

# trains for ~10 s while the task waits in the triggerer
with DAG("torchstep_pods_deferred", schedule=None, tags=["torchstep-test"]):
    AppDefOperator(
        task_id="train",
        app=GANG,
        app_args={"steps": 20, "interval": 0.5},
        target="kubernetes",
        cfg=CFG,
        kubernetes_kwargs=FAST,
        deferrable=True,
    )
