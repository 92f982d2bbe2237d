"""Scheduled batch training on Airflow: prepare → train (elastic DDP) → evaluate, daily,
with the model as an Airflow ``Asset`` that a second DAG, ``evaluate_on_new_model``, is
scheduled on — data-aware scheduling from a distributed step.

The three steps are the components of ``components/train.py`` under ``AppDefOperator``;
each step's result is its XCom ``return_value`` and the next step reads what it needs
through templates. ``prepare`` has an APPLICATION retry budget (Airflow retries it);
``train`` a REPLICA one (the agent restarts the worker group and training resumes from the
last checkpoint). The ``fail_once``/``kill_*``/``non_retryable`` params inject faults.

Run once without a scheduler (docs/airflow.md)::

    AIRFLOW__CORE__DAGS_FOLDER=dags/airflow airflow dags test batch_training
"""

import datetime
from pathlib import Path

from airflow.sdk import DAG, Asset, Param, task
from torchstep_airflow import AppDefOperator

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = REPO / "components" / "train.py"
IMAGE = str(REPO)  # local target: the working directory; kubernetes: the image holding the repository
MODEL = Asset("torchstep://batch-training/model")


def output_of(task_id: str, name: str) -> str:
    """A template reading output ``name`` of an upstream torchstep task."""
    return "{{ ti.xcom_pull(task_ids='" + task_id + "')['outputs']['" + name + "'] }}"


with DAG(
    "batch_training",
    schedule="@daily",
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=True,  # it trains every day once unpaused: a deliberate step
    params={
        "workdir": Param("/tmp/torchstep-batch", type="string"),
        "samples": Param(4000, type="integer", minimum=100),
        "epochs": Param(4, type="integer", minimum=1),
        "lr": Param(0.05, type="number", exclusiveMinimum=0),
        "nnodes": Param("2", type="string"),
        "min_accuracy": Param(0.5, type="number"),
        "fail_once": Param(False, type="boolean"),
        "kill_rank": Param(-1, type="integer"),
        "kill_at_epoch": Param(-1, type="integer"),
        "non_retryable": Param(False, type="boolean"),
    },
    tags=["torchstep", "example"],
    doc_md=__doc__,
) as batch_training:
    prepare = AppDefOperator(
        task_id="prepare",
        app=f"{COMPONENTS}:prepare",
        app_args={
            "out": "{{ params.workdir }}/data",
            "samples": "{{ params.samples }}",
            "fail_once": "{{ params.fail_once }}",
            "image": IMAGE,
        },
    )
    train = AppDefOperator(
        task_id="train",
        app=f"{COMPONENTS}:train",
        app_args={
            "data": output_of("prepare", "data_dir"),
            "ckpt": "{{ params.workdir }}/ckpt",
            "epochs": "{{ params.epochs }}",
            "lr": "{{ params.lr }}",
            "nnodes": "{{ params.nnodes }}",
            "nproc_per_node": 2,
            "kill_rank": "{{ params.kill_rank }}",
            "kill_at_epoch": "{{ params.kill_at_epoch }}",
            "non_retryable": "{{ params.non_retryable }}",
            "image": IMAGE,
        },
    )

    @task(outlets=[MODEL])
    def publish_model(result: dict, *, outlet_events=None) -> str:
        """Emit the model Asset (with its path and training accuracy) for downstream DAGs."""
        path = result["outputs"]["model"]
        outlet_events[MODEL].extra = {"model": path, "accuracy": result["outputs"]["accuracy"]}
        return path

    evaluate = AppDefOperator(
        task_id="evaluate",
        app=f"{COMPONENTS}:evaluate",
        app_args={
            "data": output_of("prepare", "data_dir"),
            "model": output_of("train", "model"),
            "min_accuracy": "{{ params.min_accuracy }}",
            "image": IMAGE,
        },
    )
    published = publish_model(train.output)
    prepare >> train >> [published, evaluate]


with DAG(
    "evaluate_on_new_model",
    schedule=[MODEL],
    start_date=datetime.datetime(2026, 1, 1),
    catchup=False,
    params={"data": Param("/tmp/torchstep-batch/data", type="string"), "model": Param("", type="string")},
    tags=["torchstep", "example"],
) as evaluate_on_new_model:

    @task
    def new_model(*, triggering_asset_events=None, params=None) -> str:
        """The model path of the Asset event that triggered this run (else params.model)."""
        for events in (triggering_asset_events or {}).values():
            for event in events:
                if event.extra.get("model"):
                    return event.extra["model"]
        return params["model"]

    model = new_model()
    score = AppDefOperator(
        task_id="evaluate",
        app=f"{COMPONENTS}:evaluate",
        app_args={"data": "{{ params.data }}", "model": "{{ ti.xcom_pull(task_ids='new_model') }}", "image": IMAGE},
    )
    model >> score
