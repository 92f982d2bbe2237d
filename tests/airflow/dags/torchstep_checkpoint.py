"""A DAG whose torchstep task resumes from the step's checkpoint directory (tests/airflow):
``cfg={"checkpoint_dir": ...}`` (templated) reaches every rank as TORCHSTEP_CHECKPOINT_DIR."""

import os

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
from torchx import specs

TESTS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
RESUMABLE = os.path.join(TESTS, "local", "scripts", "resumable.py")

role = specs.Role(
    "trainer",
    image="",
    entrypoint="python",
    args=[RESUMABLE, "--epochs", "7", "--epoch-s", "0"],
    metadata={"torchstep": {"nproc_per_node": 2}},
)

with DAG("torchstep_checkpoint", schedule=None, params={"ckpt": ""}, tags=["torchstep-test"]) as checkpoint:
    AppDefOperator(
        task_id="train", app=specs.AppDef("resume", roles=[role]), cfg={"checkpoint_dir": "{{ params.ckpt }}"}
    )
