"""Elastic data-parallel training of a small classifier (CPU, gloo) that checkpoints every
epoch and resumes from the last checkpoint after any restart or retry — a failure costs at
most one epoch.

Run under ``torchstep-agent`` or ``torchrun``; rank 0 publishes, per epoch, ``epoch``,
``loss`` and ``accuracy`` (``torchstep.output``; the last values land in the step result),
``first_epoch`` (where this run started: > 0 after a resume), ``history`` and, at the end,
``model`` (the saved ``model.pt``).

Fault injection for demos and tests (each fires once, remembered in the checkpoint dir):
``--kill-rank R --kill-at-epoch E`` (rank R SIGKILLs itself mid-epoch E),
``--fail-once`` (every rank exits 1 before training, a retryable failure),
``--non-retryable`` (raise ``torchstep.NonRetryableError``).

Example::

    torchrun --nproc-per-node 2 components/apps/train_elastic.py --data /tmp/data --ckpt /tmp/ckpt --epochs 4
"""

import argparse
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchstep
from torch.nn.parallel import DistributedDataParallel


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the dataset directory (train.pt)")
    p.add_argument("--ckpt", required=True, help="checkpoint directory (shared by every node)")
    p.add_argument("--model-dir", default="", help="rank 0 saves model.pt here (default: the checkpoint dir)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=32, help="examples per rank and step")
    p.add_argument("--kill-rank", type=int, default=-1)
    p.add_argument("--kill-at-epoch", type=int, default=-1)
    p.add_argument("--fail-once", action="store_true")
    p.add_argument("--non-retryable", action="store_true")
    return p.parse_args()


def model_of(dim: int, classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(dim, 32), torch.nn.ReLU(), torch.nn.Linear(32, classes))


def once(ckpt: str, name: str) -> bool:
    """True the first time ``name`` is asked for in ``ckpt`` (an O_EXCL marker file)."""
    try:
        os.close(os.open(os.path.join(ckpt, f".fault-{name}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        return True
    except FileExistsError:
        return False


@torchstep.record
def main() -> None:
    a = parse()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # plain `python` (e.g. TorchX's local_cwd without torchrun): a world of one
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(a.ckpt, exist_ok=True)
    dist.barrier()
    if a.non_retryable:
        raise torchstep.NonRetryableError("--non-retryable: a bad configuration, retrying cannot help")
    if a.fail_once and rank == 0 and once(a.ckpt, "fail-once"):
        print("fail-once: exiting 1 before training (a retryable failure)", flush=True)
        sys.exit(1)
    data = torch.load(os.path.join(a.data, "train.pt"))
    x, y, classes = data["x"], data["y"], int(data["classes"])
    torch.manual_seed(0)
    model = DistributedDataParallel(model_of(x.shape[1], classes))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    last = os.path.join(a.ckpt, "last.pt")
    start, history = 0, []
    if os.path.exists(last):
        state = torch.load(last)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start, history = state["epoch"] + 1, state["history"]
        if rank == 0:
            print(f"resuming from the checkpoint of epoch {state['epoch']}: starting at epoch {start}", flush=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0:
        torchstep.output("first_epoch", start)
    for epoch in range(start, a.epochs):
        gen = torch.Generator().manual_seed(1000 * epoch + rank)
        order = torch.randperm(len(x), generator=gen)[rank::world]  # this rank's share of the epoch
        model.train()
        for i in range(0, len(order), a.batch_size):
            idx = order[i : i + a.batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            torchstep.heartbeat()
            if rank == a.kill_rank and epoch == a.kill_at_epoch and i > len(order) // 2 and once(a.ckpt, "kill"):
                print(f"rank {rank}: killing myself mid-epoch {epoch}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        model.eval()
        with torch.no_grad():
            logits = model.module(x)
            stats = torch.tensor([F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()])
        dist.all_reduce(stats)
        stats /= world
        record = {
            "epoch": epoch,
            "loss": round(stats[0].item(), 5),
            "accuracy": round(stats[1].item(), 5),
            "world": world,
            "restart": restart,
        }
        history.append(record)
        if rank == 0:
            tmp = f"{last}.tmp"
            torch.save(
                {"model": model.module.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch, "history": history},
                tmp,
            )
            os.replace(tmp, last)
            print(f"epoch {epoch}: {json.dumps(record)}", flush=True)
            for key in ("epoch", "loss", "accuracy"):
                torchstep.output(key, record[key])
            torchstep.output("history", history)
        dist.barrier()  # nobody starts the next epoch before its checkpoint exists
    if rank == 0:
        out = a.model_dir or a.ckpt
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, "model.pt")
        torch.save({"model": model.module.state_dict(), "dim": x.shape[1], "classes": classes}, f"{path}.tmp")
        os.replace(f"{path}.tmp", path)
        torchstep.output("model", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
