"""The browser tests' worker: ``ranks.py MODE LINES`` on every rank of a 2 x 2 step.

Every rank prints LINES numbered lines (with progress) and a line wider than a console, then:

ok    all_reduce the ranks' numbers; rank 0 publishes ``world_size`` and ``rank_sum``
fail  rank 3 raises torchstep.NonRetryableError; the others wait in all_reduce
hang  rank 3 sleeps in ``load_batch`` (a stuck data loader); the others wait in all_reduce
"""

import sys
import time

import torch
import torch.distributed as dist
import torchstep


def load_batch(rank: int) -> None:
    """A data loader that never returns (the hang the timeout stops)."""
    print(f"rank {rank} loading its batch", flush=True)
    while True:
        time.sleep(1)


@torchstep.record
def main() -> None:
    mode, lines = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for i in range(1, lines + 1):
        print(f"rank {rank} of {world} line {i} of {lines}", flush=i == lines)
        torchstep.progress(i, lines)  # the Prefect progress artifact (rewritten at most every 0.2 s)
    print(f"rank {rank} wide line " + "x" * 3000 + " end of the wide line", flush=True)
    if mode == "fail" and rank == 3:
        raise torchstep.NonRetryableError("rank 3: shard 3 is corrupt: retrying cannot help")
    if mode == "hang" and rank == 3:
        load_batch(rank)
    t = torch.tensor([rank])
    dist.all_reduce(t)
    if rank == 0:
        torchstep.output("world_size", world)
        torchstep.output("rank_sum", int(t.item()))
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
