"""A training loop that resumes from the step's checkpoint: it starts after the newest
checkpoint in ``torchstep.checkpoint_dir()`` (``torchstep.last_checkpoint()``), saves one per
step (written under a ``.tmp`` name, then renamed: never half a checkpoint), and prints where
it started and each step. Rank 0 only writes; every rank reads."""

import argparse
import os
import signal
import time

import torchstep


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
    directory = torchstep.checkpoint_dir()
    assert directory, "TORCHSTEP_CHECKPOINT_DIR is not set"
    last = torchstep.last_checkpoint()
    start = int(open(last).read()) + 1 if last else 0
    print(f"resumed from {os.path.basename(last)}" if last else "started from scratch", flush=True)
    writer = os.environ.get("RANK", "0") == "0"
    for step in range(start, args.steps):
        time.sleep(args.interval)
        if not writer:
            continue
        tmp = os.path.join(directory, f"step-{step:04d}.tmp")
        with open(tmp, "w") as f:
            f.write(str(step))
        os.rename(tmp, tmp[: -len(".tmp")])
        print(f"step {step} saved", flush=True)
    print(f"done at step {args.steps - 1}", flush=True)


if __name__ == "__main__":
    main()
