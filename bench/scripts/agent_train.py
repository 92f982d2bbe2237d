"""Agent node-loss benchmark worker: all-reduce at the full world size until a peer is
lost; at a smaller size do --steps all-reduces and exit. Each process writes the time of
its first all-reduce to DIR/first.<pid>.json and its pid to $PIDS_DIR.
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
p.add_argument("--steps", type=int, default=5)
a = p.parse_args()
if os.environ.get("PIDS_DIR"):
    open(os.path.join(os.environ["PIDS_DIR"], str(os.getpid())), "w").close()

dist.init_process_group("gloo")
world = dist.get_world_size()
step = 0
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    if step == 0:
        tmp = os.path.join(a.dir, f".first.{os.getpid()}")
        with open(tmp, "w") as f:
            json.dump({"time": time.time(), "world": world, "pid": os.getpid()}, f)
        os.replace(tmp, os.path.join(a.dir, f"first.{os.getpid()}.json"))
    step += 1
    if world < a.full and step >= a.steps:
        break
    time.sleep(0.05)
dist.destroy_process_group()
