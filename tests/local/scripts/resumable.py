"""A training loop that resumes from the step's last checkpoint (torchstep.last_checkpoint()):
it logs where it starts, saves epoch-<n> (written under a .tmp name, then renamed) and sleeps
``--epoch-s`` per epoch."""

import argparse
import os
import time

import torchstep

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--epoch-s", type=float, default=0.2)
ns = ap.parse_args()
last = torchstep.last_checkpoint()
start = int(open(last).read()) + 1 if last else 0
print(f"env last checkpoint: {os.environ.get('TORCHSTEP_LAST_CHECKPOINT', '<unset>')!r}", flush=True)
print(f"resuming at epoch {start} from {last}", flush=True)
directory = torchstep.checkpoint_dir()
for epoch in range(start, ns.epochs):
    if int(os.environ.get("RANK", "0")) == 0:
        tmp = os.path.join(directory, f"epoch-{epoch:03d}.tmp")
        with open(tmp, "w") as f:
            f.write(str(epoch))
        os.replace(tmp, os.path.join(directory, f"epoch-{epoch:03d}"))
    print(f"epoch {epoch} done", flush=True)
    time.sleep(ns.epoch_s)
torchstep.output("first_epoch", start)
