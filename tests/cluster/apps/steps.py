"""Training-like steps: every rank all-reduces once per step (gloo), ``--steps`` times,
``--interval`` seconds apart; rank 0 prints each step with the world size. A lost peer
fails the step (the agent restarts the group, which starts over)."""

import argparse
import signal
import time

import torch
import torch.distributed as dist


def stop_slowly(seconds: float) -> None:
    print(f"SIGTERM: stopping within {seconds:g} s", flush=True)
    time.sleep(seconds)
    raise SystemExit(143)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument(
        "--stop-s",
        type=float,
        default=0.0,
        help="on SIGTERM, take this long to stop (a final checkpoint, as trainers do)",
    )
    args = p.parse_args()
    if args.stop_s > 0:
        signal.signal(signal.SIGTERM, lambda *_: stop_slowly(args.stop_s))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(args.steps):
        t = torch.ones(1)
        dist.all_reduce(t)
        if rank == 0:
            print(f"step {step} world {world} sum {int(t.item())}", flush=True)
        time.sleep(args.interval)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
