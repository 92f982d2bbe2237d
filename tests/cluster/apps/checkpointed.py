"""A training loop that resumes from the step's checkpoint: it starts after the newest
checkpoint in ``torchstep.checkpoint_dir()`` (``torchstep.last_checkpoint()``), saves one per
step (written under a ``.tmp`` name, then renamed: never half a checkpoint), and prints where
it started and each step. Rank 0 only writes; every rank reads."""

import os
import time

import loop_args  # beside this script
import torchstep


def main() -> None:
    args = loop_args.parse(__doc__.splitlines()[0])
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
    loop_args.hold(args)
    print(f"done at step {args.steps - 1}", flush=True)


if __name__ == "__main__":
    main()
