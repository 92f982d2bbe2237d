"""Scheduled batch training on Prefect: prepare → train (elastic DDP) → evaluate, the
components of ``components/train.py`` as Prefect tasks, results passed between them.

Run once on this machine (from the repository root)::

    python dags/prefect/batch_training.py [--epochs 4] [--kill-rank 1 --kill-at-epoch 1] [--fail-once]

Serve it on a schedule::

    python dags/prefect/batch_training.py --serve --cron "0 2 * * *"
"""

import argparse
import os
from pathlib import Path

from prefect import flow
from torchstep_prefect import app_task

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ROOT / "components" / "train.py"
prepare = app_task(f"{COMPONENTS}:prepare", name="prepare")  # APPLICATION retry: Prefect retries it once
train = app_task(f"{COMPONENTS}:train", name="train")  # REPLICA restarts: the agent restarts the group
evaluate = app_task(f"{COMPONENTS}:evaluate", name="evaluate")


@flow(name="batch-training", log_prints=True)
def batch_training(
    workdir: str = "/tmp/torchstep-batch",
    samples: int = 4000,
    epochs: int = 4,
    lr: float = 0.05,
    nnodes: str = "2",
    nproc_per_node: int = 2,
    min_accuracy: float = 0.5,
    kill_rank: int = -1,
    kill_at_epoch: int = -1,
    fail_once: bool = False,
    non_retryable: bool = False,
) -> dict:
    """prepare → train → evaluate; the last three parameters inject faults (demo and tests)."""
    image = str(ROOT)  # the local target runs in this directory (a container image on Kubernetes)
    data = prepare(out=os.path.join(workdir, "data"), samples=samples, fail_once=fail_once, image=image)
    trained = train(
        data=data["outputs"]["data_dir"],
        ckpt=os.path.join(workdir, "ckpt"),
        epochs=epochs,
        lr=lr,
        nnodes=nnodes,
        nproc_per_node=nproc_per_node,
        kill_rank=kill_rank,
        kill_at_epoch=kill_at_epoch,
        non_retryable=non_retryable,
        image=image,
    )
    scored = evaluate(
        data=data["outputs"]["data_dir"], model=trained["outputs"]["model"], min_accuracy=min_accuracy, image=image
    )
    print(f"accuracy {scored['outputs']['accuracy']} (chance {scored['outputs']['chance']})")
    return {"prepare": data, "train": trained, "evaluate": scored}


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help="serve the flow on a cron schedule")
    p.add_argument("--cron", default="0 2 * * *")
    p.add_argument("--workdir", default="/tmp/torchstep-batch")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at-epoch", type=int, default=-1)
    p.add_argument("--fail-once", action="store_true")
    a = p.parse_args()
    if a.serve:
        batch_training.serve(name="batch-training", cron=a.cron)
    else:
        batch_training(
            workdir=a.workdir,
            epochs=a.epochs,
            kill_rank=a.kill_rank,
            kill_at_epoch=a.kill_at_epoch,
            fail_once=a.fail_once,
        )
