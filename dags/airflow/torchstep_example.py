"""The torchstep example pipeline for Airflow: prepare → train → evaluate.

``train`` is a data-parallel job of 2 replicas x 2 processes (torch.distributed, gloo,
CPU), every replica under torchstep's embedded agent. Each step's result (state, exit
codes, restarts, rank-0 outputs) is its XCom ``return_value``; the next step reads the
outputs it needs through templates. ``params`` are editable when triggering the DAG.

Run it once without a scheduler (see docs/airflow.md)::

    AIRFLOW__CORE__DAGS_FOLDER=dags/airflow airflow dags test torchstep_example
"""

import example_components as components  # a module next to this DAG file (the bundle is on sys.path)
from airflow.sdk import DAG, Param, task
from torchstep_airflow import AppDefOperator
from torchx import specs

TARGET = "local"  # "kubernetes": the same DAG on a cluster (the image must hold the app scripts)


def output_of(task_id: str, name: str) -> str:
    """A template reading output ``name`` of an upstream torchstep task."""
    return "{{ ti.xcom_pull(task_ids='" + task_id + "')['outputs']['" + name + "'] }}"


@task.torchstep(target=TARGET)
def evaluate(data: str, model: str, max_mse: float = 0.05) -> specs.AppDef:
    """Score the model: a TorchX component turned into a task by @task.torchstep."""
    return components.evaluate(data=data, model=model, max_mse=max_mse)


with DAG(
    "torchstep_example",
    schedule=None,
    params={
        "lr": Param(0.5, type="number", minimum=0),
        "epochs": Param(60, type="integer", minimum=1),
        "rows": Param(256, type="integer", minimum=8),
    },
    tags=["torchstep", "example"],
    doc_md=__doc__,
) as dag:
    prepare = AppDefOperator(
        task_id="prepare", app=components.prepare, app_args={"rows": "{{ params.rows }}"}, target=TARGET
    )
    train = AppDefOperator(
        task_id="train",
        app=components.train,
        app_args={
            "data": output_of("prepare", "data"),
            "lr": "{{ params.lr }}",
            "epochs": "{{ params.epochs }}",
            "replicas": 2,
            "nproc_per_node": 2,
        },
        target=TARGET,
    )
    score = evaluate(data=output_of("prepare", "data"), model=output_of("train", "model"))
    prepare >> train >> score
