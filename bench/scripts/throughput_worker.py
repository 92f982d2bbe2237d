"""Worker of the throughput benchmarks (bench/train_throughput.py, bench/log_throughput.py,
bench/agent_cost.py), run by torchstep-agent and by torchrun alike.

Every line it prints is numbered, ``TSLINE r=<rank> i=<n> <pad>``, from 0 per rank, so the
benchmark can tell a lost, duplicated or torn line in the console and in the rank files;
``--out DIR`` gets ``rank<N>.json`` with how many lines the rank printed and its timings.

Modes:

- ``train``: DDP training of an MLP on gloo (one step about 50 ms on one core); after
  ``--warmup`` steps, one timed window of ``--steps`` steps per entry of ``--windows``
  (``plain``: no output; ``log``: every rank prints ``--rate`` lines/s, paced by the wall
  clock inside the training loop). ``--seconds S`` instead trains with logging for S seconds
  after the warm-up (agent_cost.py), writing ``DIR/started`` when the warm-up is over.
- ``flood``: print ``--lines`` lines as fast as possible, then ``TSEND r=<rank>``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

PAD = "x" * 64  # a line of ~90 bytes, like a log record
STARTED = time.time()  # the worker's silence before its first line (bench/train_throughput.py --hang-timeout)


def emit(rank: int, start: int, count: int) -> None:
    write = sys.stdout.write
    for i in range(start, start + count):
        write(f"TSLINE r={rank} i={i:09d} {PAD}\n")


def dump(out: str, rank: int, info: dict) -> None:
    tmp = os.path.join(out, f".rank{rank}.json")
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, os.path.join(out, f"rank{rank}.json"))


def flood(a: argparse.Namespace, rank: int) -> None:
    t0 = time.time()
    emit(rank, 0, a.lines)
    sys.stdout.write(f"TSEND r={rank}\n")
    sys.stdout.flush()
    dump(a.out, rank, {"lines": a.lines, "first": t0, "written": time.time()})


def train(a: argparse.Namespace, rank: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo")
    layers = [m for _ in range(a.layers) for m in (torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU())]
    model = DistributedDataParallel(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(a.batch, a.hidden)
    printed = 0
    first_line: float | None = None  # wall clock of the first line this rank printed
    slowest = 0.0  # the slowest training step (s)

    def step() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    def window(steps: int, log: bool, seconds: float = 0.0) -> tuple[int, float]:
        nonlocal printed, first_line, slowest
        t0 = time.perf_counter()
        base = printed
        n = 0
        while n < steps or seconds:
            if seconds:  # the ranks stop together (a lone extra step would hang DDP)
                done = torch.tensor([int(time.perf_counter() - t0 >= seconds)])
                dist.all_reduce(done, op=dist.ReduceOp.MAX)
                if done.item():
                    break
            before = time.perf_counter()
            step()
            slowest = max(slowest, time.perf_counter() - before)
            n += 1
            if log:  # catch up with the wall clock: --rate lines/s whatever the step time
                owed = int(a.rate * (time.perf_counter() - t0)) - (printed - base)
                if owed > 0:
                    if first_line is None:
                        first_line = time.time()
                    emit(rank, printed, owed)
                    printed += owed
        dist.barrier()
        return n, time.perf_counter() - t0

    window(a.warmup, False)
    results = []
    if a.seconds:
        if rank == 0:
            open(os.path.join(a.out, "started"), "w").close()
        n, secs = window(0, True, a.seconds)
        results.append({"kind": "log", "steps": n, "seconds": secs})
    else:
        for kind in a.windows.split(","):
            n, secs = window(a.steps, kind == "log")
            results.append({"kind": kind, "steps": n, "seconds": secs})
    sys.stdout.flush()
    silent = (first_line or time.time()) - STARTED
    dump(a.out, rank, {"lines": printed, "windows": results, "silent_s": silent, "slowest_step_s": slowest})
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "flood"])
    p.add_argument("--out", required=True)
    p.add_argument("--lines", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--windows", default="plain,log")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--rate", type=float, default=2000.0)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    a = p.parse_args()
    rank = int(os.environ["RANK"])
    flood(a, rank) if a.mode == "flood" else train(a, rank)


if __name__ == "__main__":
    main()
