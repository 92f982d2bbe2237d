"""Prepare the training run: check the hyperparameters and apply the linear scaling rule
(the learning rate grows with the number of workers), then publish them as outputs.

Plain Python under torchstep-agent (no torch needed)."""

import argparse

import torchstep


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--base_lr", type=float, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    a = p.parse_args()
    if not 0 < a.base_lr < 1:
        raise torchstep.NonRetryableError(f"base_lr must be in (0, 1), got {a.base_lr}: retrying cannot help")
    lr = round(min(a.base_lr * a.workers, 0.5), 6)
    print(f"{a.workers} workers: lr {a.base_lr} -> {lr} (linear scaling, capped at 0.5), {a.steps} steps", flush=True)
    torchstep.output("lr", lr)
    torchstep.output("steps", a.steps)


if __name__ == "__main__":
    main()
