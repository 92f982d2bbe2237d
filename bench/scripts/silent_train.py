"""Silent-host benchmark worker: a gloo all-reduce loop that appends one line per step,
``<time> <world size> <rank>``, to ``$SILENT_LOG`` (one file per host), forever (the
benchmark or test ends it)."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
world, rank = dist.get_world_size(), dist.get_rank()
with open(os.environ["SILENT_LOG"], "a", buffering=1) as log:
    while True:
        t = torch.ones(1)
        dist.all_reduce(t)
        log.write(f"{time.time():.3f} {world} {rank}\n")
        time.sleep(0.1)
