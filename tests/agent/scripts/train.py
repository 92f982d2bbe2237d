"""Elastic training loop for the multi-node tests and benchmarks (gloo, CPU).

At the full world size (--full) it all-reduces until the group breaks (a peer is killed);
at any smaller size it does --steps all-reduces and exits 0. Each process records the
time of its first all-reduce in DIR/first.<pid>.json (world size, restart count).
"""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--dir", required=True)
p.add_argument("--full", type=int, default=2)
p.add_argument("--steps", type=int, default=10)
a = p.parse_args()
if os.environ.get("PIDS_DIR"):  # for the tests' /proc checks
    open(os.path.join(os.environ["PIDS_DIR"], f"worker.{os.getpid()}"), "w").close()

dist.init_process_group("gloo")
world = dist.get_world_size()
step = 0
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    assert int(t.item()) == world
    if step == 0:
        info = {
            "time": time.time(),
            "world": world,
            "rank": dist.get_rank(),
            "restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]),
            "pid": os.getpid(),
        }
        tmp = os.path.join(a.dir, f".first.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, os.path.join(a.dir, f"first.{os.getpid()}.json"))
    step += 1
    if world < a.full and step >= a.steps:
        break
    time.sleep(0.05)
dist.destroy_process_group()
os._exit(0)  # skip the interpreter's teardown (~0.5-1 s with torch loaded)
