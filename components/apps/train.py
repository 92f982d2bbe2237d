"""The project's main job: data-parallel training of a small regression model on synthetic
data, on CPU with gloo — under ``torchstep-agent``, ``torchrun`` or plain ``python``.

Every rank draws its own batches from a seeded generator; DDP averages the gradients;
rank 0 reports the global mean loss with ``torchstep.output`` (it lands in the step
result) and ``torchstep.record`` turns a crash into a root cause with a traceback.

Example::

    torchrun --nproc-per-node 2 components/apps/train.py --steps 50 --lr 0.1
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchstep
from torch.nn.parallel import DistributedDataParallel


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="optimizer steps")
    p.add_argument("--lr", type=float, default=0.1, help="learning rate")
    p.add_argument("--batch-size", type=int, default=64, help="examples per rank and step")
    p.add_argument("--dim", type=int, default=16, help="input features")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic data")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds per step (a slower job)")
    p.add_argument("--run-id", default="", help="shown in the log (the component passes ${app_id})")
    p.add_argument(
        "--model-dir", default="", help="rank 0 saves the model here and publishes the path as output 'model'"
    )
    return p.parse_args(argv)


@torchstep.record
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    true_w = torch.randn(args.dim, 1)  # the same on every rank
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 1)  # each rank its own data
    model = DistributedDataParallel(torch.nn.Linear(args.dim, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    first = last = 0.0
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.dim, generator=gen)
        y = x @ true_w + 0.01 * torch.randn(args.batch_size, 1, generator=gen)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torchstep.heartbeat()
        last = loss.item()
        first = last if step == 0 else first
        if args.step_time:
            time.sleep(args.step_time)
    mean = torch.tensor([first, last])
    dist.all_reduce(mean)
    mean /= world
    if rank == 0:
        role = os.environ.get("TORCHSTEP_ROLE", os.environ.get("ROLE_NAME", "trainer"))
        print(f"{role} {args.run_id}: {args.steps} steps on {world} ranks, loss {mean[0]:.4f} -> {mean[1]:.4f}")
        torchstep.output("loss", round(float(mean[1]), 6))
        torchstep.output("first_loss", round(float(mean[0]), 6))
        torchstep.output("world_size", world)
        torchstep.output("steps", args.steps)
        if args.model_dir:
            os.makedirs(args.model_dir, exist_ok=True)
            path = os.path.join(args.model_dir, "model.pt")
            torch.save(model.module.state_dict(), path)
            torchstep.output("model", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
