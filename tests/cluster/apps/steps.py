"""Training-like steps: every rank all-reduces once per step (gloo), ``--steps`` times,
``--interval`` seconds apart; rank 0 prints each step with the world size. A lost peer
fails the step (the agent restarts the group, which starts over)."""

import time

import loop_args  # beside this script
import torch
import torch.distributed as dist


def main() -> None:
    args = loop_args.parse(__doc__.splitlines()[0])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(args.steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        if rank == 0:
            print(f"step {step} world {world} sum {int(t.item())}", flush=True)
        time.sleep(args.interval)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
