"""Test worker of the stacks and hang tests: one script, behaviour chosen by --mode.

loader   gloo group; rank --rank sleeps in load_batch(), the others block in all_reduce
silent   no torch; every rank sleeps in wait_forever() without a word
blocked  like silent, with the agent's stacks signal blocked (no dump can come)
print    no torch; prints a line every 0.3 s for --seconds, then exits 0
progress no torch; torchstep.progress(i, --steps) every 0.3 s, no output, then exits 0
timer    rank --rank is stuck in slow_step() under torchstep.expires(after=2); the others wait

Every rank touches <--dir>/ready.<rank> once it is where the test wants it.
"""

import argparse
import os
import signal
import sys
import time

RANK = int(os.environ.get("RANK", "0"))


def ready(directory: str) -> None:
    if directory:
        with open(os.path.join(directory, f"ready.{RANK}"), "w") as f:
            f.write(repr(time.time()))


def load_batch(directory: str) -> None:
    ready(directory)
    time.sleep(600)


def wait_forever(directory: str) -> None:
    ready(directory)
    time.sleep(600)


def slow_step(directory: str) -> None:
    ready(directory)
    time.sleep(600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--dir", default="")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    print(f"start rank={RANK} pid={os.getpid()}", flush=True)
    if a.mode == "loader":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()
        if RANK == a.rank:
            load_batch(a.dir)
        t = torch.ones(4)
        ready(a.dir)
        dist.all_reduce(t)
    elif a.mode == "silent":
        wait_forever(a.dir)
    elif a.mode == "blocked":
        from torchstep.contract import STACKS_SIGNAL

        signal.pthread_sigmask(signal.SIG_BLOCK, [STACKS_SIGNAL])
        wait_forever(a.dir)
    elif a.mode == "timer":
        import torchstep

        if RANK == a.rank:
            with torchstep.expires(after=2, scope="slow-step"):
                slow_step(a.dir)
        else:
            wait_forever(a.dir)
    elif a.mode == "print":
        end = time.monotonic() + a.seconds
        i = 0
        while time.monotonic() < end:
            print(f"line {i} of rank {RANK}", flush=True)
            i += 1
            time.sleep(0.3)
    elif a.mode == "progress":
        import torchstep

        for i in range(a.steps):
            time.sleep(0.3)
            torchstep.progress(i + 1, a.steps)
    else:
        sys.exit(f"unknown mode {a.mode}")


if __name__ == "__main__":
    main()
