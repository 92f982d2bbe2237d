"""The flight recorder check's worker (bench/gpu_flight.py): a few all_reduces on this
rank's GPU over NCCL (gloo on the CPU in the dry mode, ``TORCHSTEP_GPU_DRY=1``), then stuck
in ``stuck()`` until the agent stops it. On SIGTERM it waits (at most 10 s) for NCCL's
flight recorder dump the agent asked for, then exits.

Usage: gpu_stuck.py OUT_DIR — writes OUT_DIR/rank<R>.json (the NCCL variables it saw) and
OUT_DIR/ready.<R> once it is stuck.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

out = sys.argv[1]
dry = os.environ.get("TORCHSTEP_GPU_DRY") == "1"
rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
seen = {k: v for k, v in os.environ.items() if k.startswith(("TORCH_NCCL_", "TORCH_FR_"))}
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump({"rank": rank, "env": seen}, f)

if dry:
    device, backend = torch.device("cpu"), "gloo"
else:
    torch.cuda.set_device(local_rank)
    device, backend = torch.device("cuda", local_rank), "nccl"
dist.init_process_group(backend)
t = torch.ones(1024, device=device)
for _ in range(5):
    dist.all_reduce(t)
if not dry:
    torch.cuda.synchronize()


def on_term(signum: int, frame: object) -> None:
    prefix = seen.get("TORCH_FR_DUMP_TEMP_FILE") or seen.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    deadline = time.monotonic() + 10
    while prefix and time.monotonic() < deadline and not os.path.exists(f"{prefix}{rank}"):
        time.sleep(0.1)
    time.sleep(0.5)  # the dump is written, then renamed: let it finish
    os._exit(0)


signal.signal(signal.SIGTERM, on_term)


def stuck() -> None:
    with open(os.path.join(out, f"ready.{rank}"), "w") as f:
        f.write(repr(time.time()))
    while True:
        time.sleep(1)


stuck()
