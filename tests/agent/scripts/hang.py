"""Test worker of the stacks and hang tests: one script, behaviour chosen by --mode.

loader   gloo group; rank --rank sleeps in load_batch(), the others block in all_reduce
silent   no torch; every rank sleeps in wait_forever() without a word
blocked  like silent, with the agent's stacks signal blocked (no dump can come)
print    no torch; prints a line every 0.3 s for --seconds, then exits 0
progress no torch; torchstep.progress(i, --steps) every 0.3 s, no output, then exits 0
timer    rank --rank is stuck in slow_step() under torchstep.expires(after=2); the others wait
peer_prints  gloo group; rank --rank prints a line every 0.3 s for --seconds (a slow log
         flood), the others wait for it in all_reduce without a word; then every rank exits 0
collectives  gloo group; every rank calls all_reduce in a loop for --seconds without a word
         (writes <--dir>/ran.<rank>: calls and seconds), then as loader; --record: under
         @torchstep.record (what gives an exec'd worker the collective hook)

Every rank touches <--dir>/ready.<rank> once it is where the test wants it.
"""

import argparse
import os
import signal
import sys
import threading
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


def _talk_until(done: threading.Event) -> None:
    while not done.wait(1.0):
        print(f"importing rank={RANK}", flush=True)


def collectives(a: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print(f"joined rank={RANK}", flush=True)  # the last line: silent from here
    t = torch.ones(4)
    dist.all_reduce(torch.zeros(1))  # every rank here: their clocks start together (within scheduling)
    start = time.monotonic()
    calls = 0
    while True:  # rank 0 says when the time is up: every rank leaves the loop after the same call
        flag = torch.tensor([1.0 if RANK == 0 and time.monotonic() - start >= a.seconds else 0.0])
        dist.all_reduce(flag)
        calls += 1
        if flag.item() > 0:
            break
        time.sleep(0.02)
    if a.dir:
        with open(os.path.join(a.dir, f"ran.{RANK}"), "w") as f:
            f.write(f"{calls} {time.monotonic() - start}")
    if RANK == a.rank:
        load_batch(a.dir)
    ready(a.dir)
    dist.all_reduce(t)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--dir", default="")
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--record", action="store_true")
    a = p.parse_args()
    print(f"start rank={RANK} pid={os.getpid()}", flush=True)
    if a.mode == "collectives" and a.record:
        # an exec'd rank imports torch itself: seconds on a loaded machine, which must not count
        # against --hang-timeout here (the test is about the silent loop): it says so meanwhile
        importing = threading.Event()
        threading.Thread(target=_talk_until, args=(importing,), daemon=True).start()
        import torch.distributed  # noqa: F401  # as a script's imports at its top: before main() runs
        import torchstep

        importing.set()

        print(f"imported rank={RANK}", flush=True)
        torchstep.record(collectives)(a)
        return
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
    elif a.mode == "collectives":
        collectives(a)
    elif a.mode == "peer_prints":
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        if RANK == a.rank:
            end, i = time.monotonic() + a.seconds, 0
            while time.monotonic() < end:
                print(f"line {i} of rank {RANK}", flush=True)
                i += 1
                time.sleep(0.3)
        t = torch.ones(1)
        dist.all_reduce(t)
        print(f"done rank={RANK} sum={int(t.item())}", flush=True)
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
