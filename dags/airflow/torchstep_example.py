"""The torchstep example pipeline for Airflow: prepare → train → evaluate.

``train`` is the project's trainer (``components/train.py:trainer``): data-parallel
training on 2 replicas x 2 processes (torch.distributed, gloo, CPU), every replica under
torchstep's embedded agent. Each step's result (state, exit codes, restarts, rank-0
outputs) is its XCom ``return_value``; the next step reads the outputs it needs through
templates. ``params`` are editable when triggering the DAG.

Run it once without a scheduler (see docs/airflow.md)::

    AIRFLOW__CORE__DAGS_FOLDER=dags/airflow airflow dags test torchstep_example
"""

import datetime
from pathlib import Path

import example_components as components  # a module next to this DAG file (the bundle is on sys.path)
from airflow.sdk import DAG, Param, task
from torchstep_airflow import AppDefOperator
from torchx import specs

REPO = Path(__file__).resolve().parents[2]
TRAINER = f"{REPO / 'components' / 'train.py'}:trainer"
TARGET = "local"  # "kubernetes": the same DAG on a cluster (images must hold the scripts)
IMAGE = str(REPO)  # local: the working directory; kubernetes: e.g. "ghcr.io/torchstep/examples:latest"


def output_of(task_id: str, name: str) -> str:
    """A template reading output ``name`` of an upstream torchstep task."""
    return "{{ ti.xcom_pull(task_ids='" + task_id + "')['outputs']['" + name + "'] }}"


@task.torchstep(target=TARGET)
def evaluate(loss: float, first_loss: float, max_ratio: float = 0.5) -> specs.AppDef:
    """Check the training result: a TorchX component turned into a task by @task.torchstep."""
    return components.evaluate(loss=loss, first_loss=first_loss, max_ratio=max_ratio)


with DAG(
    "torchstep_example",
    schedule=None,
    params={"base_lr": Param(0.05, type="number", exclusiveMinimum=0), "steps": Param(40, type="integer", minimum=1)},
    tags=["torchstep", "example"],
    doc_md=__doc__,
) as dag:
    prepare = AppDefOperator(
        task_id="prepare",
        app=components.prepare,
        app_args={"base_lr": "{{ params.base_lr }}", "workers": 4, "steps": "{{ params.steps }}"},
        target=TARGET,
    )
    train = AppDefOperator(
        task_id="train",
        app=TRAINER,
        app_args={
            "replicas": 2,
            "nproc_per_node": 2,
            "lr": output_of("prepare", "lr"),
            "steps": output_of("prepare", "steps"),
            "max_retries": 1,  # APPLICATION policy: Airflow retries the whole step once
            "image": IMAGE,
        },
        retry_delay=datetime.timedelta(seconds=10),  # the AppDef sets none; Airflow's default is 300 s
        target=TARGET,
    )
    score = evaluate(loss=output_of("train", "loss"), first_loss=output_of("train", "first_loss"))
    prepare >> train >> score
