"""Worker script of the local-launcher tests (run by torchstep-agent, torchrun or python).

worker.py report OUTDIR [ARGS...]   join the group, all_reduce, write OUTDIR/<role>-<rank>.json
worker.py loop STEPS SLEEP          all_reduce STEPS times, printing "step i" (a long job)
worker.py attempts COUNTER N CODE   append a line to COUNTER; exit CODE while it has < N lines
"""

import json
import os
import sys
import time


def report(outdir: str, args: list) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    role = os.environ.get("TORCHSTEP_ROLE", "?")
    rank = dist.get_rank()
    data_file = next((a.split("=", 1)[1] for a in args if a.startswith("--data=")), None)
    info = {
        "role": role,
        "rank": rank,
        "world": dist.get_world_size(),
        "sum": float(t),
        "args": args,
        "replica_env": os.environ.get("TORCHSTEP_REPLICA_ID"),
        "rank0_host": os.environ.get("TORCHX_RANK0_HOST"),
        "cwd": os.getcwd(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "data": open(data_file).read() if data_file else None,
        "data_env": os.environ.get("DATA_DIR"),
    }
    with open(os.path.join(outdir, f"{role}-{rank}.json"), "w") as f:
        json.dump(info, f)
    print(f"hello from {role} rank {rank} of {dist.get_world_size()}", flush=True)
    dist.destroy_process_group()


def loop(steps: int, sleep: float) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    for i in range(steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"step {i} world {int(t)}", flush=True)
        time.sleep(sleep)
    dist.destroy_process_group()


def attempts(counter: str, n: int, code: int) -> None:
    with open(counter, "a") as f:
        f.write(f"{os.getpid()}\n")
    with open(counter) as f:
        seen = len(f.readlines())
    sys.exit(code if seen < n else 0)


if __name__ == "__main__":
    mode, rest = sys.argv[1], sys.argv[2:]
    if mode == "report":
        report(rest[0], rest[1:])
    elif mode == "loop":
        loop(int(rest[0]), float(rest[1]))
    elif mode == "attempts":
        attempts(rest[0], int(rest[1]), int(rest[2]))
    else:
        sys.exit(f"unknown mode {mode}")
