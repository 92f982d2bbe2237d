"""Agent recovery benchmark worker. Attempt 0: rank 1 notes the time and crashes after the
first barrier. Attempt 1: rank 0 notes the time the restarted group passed its first barrier.

Usage: agent_recover.py OUT_DIR
"""

import os
import sys
import time

import torch.distributed as dist

out = sys.argv[1]
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
rank = int(os.environ["RANK"])
open(os.path.join(out, f"pid.{os.getpid()}"), "w").close()  # the benchmark kills hung workers by pid


def note(name: str) -> None:
    with open(os.path.join(out, f".{name}"), "w") as f:
        f.write(repr(time.time()))
    os.replace(os.path.join(out, f".{name}"), os.path.join(out, name))


dist.init_process_group("gloo")
dist.barrier()
if restart == 0:
    if rank == 1:
        note("crash")
        os._exit(3)
    dist.barrier()  # fails: rank 1 is gone
elif rank == 0:
    note("recovered")
dist.destroy_process_group()
