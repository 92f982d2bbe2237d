"""Every rank all-reduces (gloo) once per step, ``--steps`` times, ``--interval`` seconds apart,
and prints ``rank R step S world W sum X`` each time; rank 0 publishes ``world`` and ``sum``
as the step's outputs."""

import argparse
import time

import torch
import torch.distributed as dist
import torchstep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--interval", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = 0
    for step in range(args.steps):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        total = int(t.item())
        print(f"rank {rank} step {step} world {world} sum {total}", flush=True)
        time.sleep(args.interval)
    if rank == 0:
        torchstep.output("world", world)
        torchstep.output("sum", total)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
