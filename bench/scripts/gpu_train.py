"""The GPU check's worker (bench/gpu.sh): DDP training steps on this rank's GPU over NCCL,
or on the CPU over gloo in the dry mode (``TORCHSTEP_GPU_DRY=1``).

Usage: gpu_train.py OUT_DIR MODE [STEPS] — MODE ``train`` trains STEPS steps; ``crash``
kills itself (SIGKILL, between the forward and the backward pass) in its 3rd step on the
first attempt, then trains STEPS steps once restarted. Each attempt writes
OUT_DIR/rank<R>.attempt<N>.json: how it was started (forked after the zygote's import of
torch, CUDA state then), the launcher-set environment, its device and step times.
"""

import json
import os
import signal
import sys
import time

PRELOADED = "torch" in sys.modules  # imported before this script ran: forked from the zygote
BEGIN = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

out, mode = sys.argv[1], sys.argv[2]
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 20
dry = os.environ.get("TORCHSTEP_GPU_DRY") == "1"
rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
info = {
    "rank": rank,
    "attempt": attempt,
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "preloaded": PRELOADED,
    "cuda_initialized_at_start": torch.cuda.is_initialized(),  # the zygote must never have initialised it
    "env": {
        k: os.environ.get(k)
        for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")
    },
    "begin": BEGIN,
}


def note(data: dict) -> None:
    path = os.path.join(out, f"rank{rank}.attempt{attempt}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


if dry:
    device, backend = torch.device("cpu"), "gloo"
else:
    torch.cuda.set_device(local_rank)
    device, backend = torch.device("cuda", local_rank), "nccl"
dist.init_process_group(backend)
info["backend"] = dist.get_backend()
info["device"] = "cpu" if dry else f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)).to(device)
ddp = DistributedDataParallel(model, device_ids=None if dry else [local_rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
losses = []
for i in range(steps):
    x = torch.randn(128, 512, device=device)
    loss = ddp(x).square().mean()
    if mode == "crash" and attempt == 0 and i == 2:
        info["killed"] = time.time()
        note(info)
        os.kill(os.getpid(), signal.SIGKILL)  # mid-step: after the forward pass, before the all-reduce
    opt.zero_grad()
    loss.backward()  # DDP's gradient all-reduce (NCCL on a GPU)
    opt.step()
    losses.append(float(loss.detach()))  # waits for the device
    if i == 0:
        info["first_step"] = time.time()
        note(info)
info["losses"] = [losses[0], losses[-1]]
info["end"] = time.time()
note(info)
dist.destroy_process_group()
sys.stdout.flush()
os._exit(0)  # skip the interpreter's teardown
