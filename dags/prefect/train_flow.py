"""The example Prefect flow: prepare → train (a distributed torchstep step) → evaluate.

``train`` is the project's TorchX component ``components/train.py:trainer`` as a Prefect
task (its parameters are the task's; retries come from the AppDef); ``prepare`` and
``evaluate`` are plain Prefect tasks that pass values to and read the step's result.

Run once on this machine (from the repository root)::

    python dags/prefect/train_flow.py

Serve it on a schedule (a long-lived process; runs appear in the Prefect UI)::

    python dags/prefect/train_flow.py --serve --cron "0 2 * * *"
"""

import argparse
from pathlib import Path

from prefect import flow, task
from torchstep_prefect import app_task

ROOT = Path(__file__).resolve().parents[2]
train = app_task(f"{ROOT / 'components' / 'train.py'}:trainer", name="train", tags=["torchstep"])


@task
def prepare(base_lr: float, workers: int) -> float:
    """The learning rate for `workers` data-parallel workers (linear scaling, capped)."""
    if not 0 < base_lr < 1:
        raise ValueError(f"base_lr must be in (0, 1), got {base_lr}")
    return round(min(base_lr * workers, 0.5), 6)


@task
def evaluate(result: dict, max_ratio: float) -> float:
    """Fail unless the loss dropped below max_ratio of its first value; the final loss."""
    out = result["outputs"]
    if out["loss"] > max_ratio * out["first_loss"]:
        raise RuntimeError(f"training did not converge: {out['first_loss']} -> {out['loss']}")
    return out["loss"]


@flow(name="torchstep-train", log_prints=True)
def train_flow(
    base_lr: float = 0.02, steps: int = 30, replicas: int = 2, nproc_per_node: int = 2, max_ratio: float = 0.5
) -> float:
    """prepare → train (replicas x nproc_per_node DDP processes, gloo) → evaluate."""
    lr = prepare(base_lr, replicas * nproc_per_node)
    result = train(lr=lr, steps=steps, replicas=replicas, nproc_per_node=nproc_per_node, image=str(ROOT))
    loss = evaluate(result, max_ratio)
    print(f"{result['app_id']}: {result['state']}, loss {loss}")
    return loss


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help="serve the flow on a cron schedule")
    p.add_argument("--cron", default="0 2 * * *")
    a = p.parse_args()
    if a.serve:
        train_flow.serve(name="nightly", cron=a.cron)
    else:
        train_flow()
