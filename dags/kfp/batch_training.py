"""Scheduled batch training on KFP v2: prepare → train (elastic DDP) → evaluate, the
components of ``components/train.py`` as KFP components; Metrics and Model artifacts.

From the repository root::

    python dags/kfp/batch_training.py --compile batch_training.yaml   # then upload / schedule (docs/kfp.md)
    python dags/kfp/batch_training.py --local [--kill-rank 1 --kill-at-epoch 1] [--fail-once]

On a cluster a ``nnodes`` default above 1 makes ``train`` a launcher step (Indexed Jobs);
under kfp.local the step runs its processes on this machine.
"""

import argparse
import sys
import tempfile

if __name__ == "__main__" and "--local" in sys.argv:  # before the pipeline is defined (docs/kfp.md)
    from kfp import local

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=tempfile.mkdtemp(prefix="kfp-local-"))

from kfp import compiler, dsl
from torchstep_kfp import component_from_fn

COMPONENTS = "components/train.py"  # resolved from the working directory (the image's, on a cluster)
prepare_op = component_from_fn(f"{COMPONENTS}:prepare", outputs={"data_dir": str})
train_op = component_from_fn(
    f"{COMPONENTS}:train",
    defaults={"nnodes": "1", "nproc_per_node": 2},  # one pod, 2 processes (KFP fixes the shape at compile time)
    outputs={"model": str, "first_epoch": int, "history": list},
    metrics=True,
    model="model_artifact",
)
evaluate_op = component_from_fn(f"{COMPONENTS}:evaluate", outputs={"accuracy": float, "chance": float}, metrics=True)


@dsl.pipeline(name="batch-training")
def batch_training(
    workdir: str = "/tmp/torchstep-batch",
    samples: int = 4000,
    epochs: int = 4,
    lr: float = 0.05,
    min_accuracy: float = 0.5,
    kill_rank: int = -1,
    kill_at_epoch: int = -1,
    fail_once: bool = False,
    non_retryable: bool = False,
) -> float:
    """prepare → train → evaluate; the last four parameters inject faults (demo and tests)."""
    data = prepare_op(out=f"{workdir}/data", samples=samples, fail_once=fail_once)
    trained = train_op(
        data=data.outputs["data_dir"],
        ckpt=f"{workdir}/ckpt",
        epochs=epochs,
        lr=lr,
        kill_rank=kill_rank,
        kill_at_epoch=kill_at_epoch,
        non_retryable=non_retryable,
    )
    scored = evaluate_op(data=data.outputs["data_dir"], model=trained.outputs["model"], min_accuracy=min_accuracy)
    return scored.outputs["accuracy"]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", metavar="OUT.yaml", help="compile the pipeline to this file")
    p.add_argument("--local", action="store_true", help="run it here with kfp.local")
    p.add_argument("--workdir", default=tempfile.mkdtemp(prefix="torchstep-batch-"))
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at-epoch", type=int, default=-1)
    p.add_argument("--fail-once", action="store_true")
    a = p.parse_args()
    if a.compile:
        compiler.Compiler().compile(batch_training, a.compile)
        print(f"compiled to {a.compile}")
    if a.local:
        run = batch_training(
            workdir=a.workdir,
            epochs=a.epochs,
            kill_rank=a.kill_rank,
            kill_at_epoch=a.kill_at_epoch,
            fail_once=a.fail_once,
        )
        print(f"held-out accuracy: {run.output}")
