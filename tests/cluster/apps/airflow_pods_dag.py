"""DAGs of tests/cluster/test_airflow_deployment_on_pods.py: ``AppDefOperator(target="kubernetes")``
of gang.py's 2x2 gloo gang, run by a real Airflow deployment on the one-machine cluster's pods.
The cluster is Airflow's default kubernetes connection (``kubernetes_default``, made by the test
through the REST API, as a deployer makes it), for the workers and the triggerer alike.

Linked into the deployment's dags folder: ``__file__`` resolves to this directory.
"""

from pathlib import Path

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
from torchx import specs

GANG = f"{Path(__file__).resolve().parent / 'gang.py'}:allreduce_steps"
KPO_STEP = str(Path(__file__).resolve().parent / "kpo_step.py")
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

# one role, one replica: the KubernetesPodOperator path; the step holds ~25 s (the test SIGKILLs
# the task process meanwhile), one retry 1 s later
KPO_ROLE = specs.Role(
    "step",
    image="python:3.11",
    entrypoint="python",
    args=[KPO_STEP, "--hold", "25"],
    resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    max_retries=1,
    metadata={"torchstep": {"retry_delay": 1}},
)
with DAG("torchstep_pods_kpo_durable", schedule=None, tags=["torchstep-test"]):
    AppDefOperator(
        task_id="train",
        app=specs.AppDef("kpo-durable", roles=[KPO_ROLE]),
        target="kubernetes",
        cfg=CFG,
        kubernetes_kwargs={"poll_interval": 1},
    )
