"""The training loops' shared command line (``--steps``, ``--interval``, ``--stop-s``,
``--hold``), ``--stop-s``: on SIGTERM, take that long to stop (a final checkpoint, as trainers
do), and :func:`hold`: after the last step, wait until a file exists (a test releases the step
once it has seen what it watches, however slowly a loaded machine got there)."""

import argparse
import os
import signal
import time


def parse(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--stop-s", type=float, default=0.0, help="on SIGTERM, take this long to stop")
    p.add_argument("--hold", default="", help="after the last step, wait until this file exists")
    args = p.parse_args()
    if args.stop_s > 0:
        signal.signal(signal.SIGTERM, lambda *_: _stop_slowly(args.stop_s))
    return args


def _stop_slowly(seconds: float) -> None:
    print(f"SIGTERM: stopping within {seconds:g} s", flush=True)
    time.sleep(seconds)
    raise SystemExit(143)


def hold(args: argparse.Namespace) -> None:
    """Wait until ``--hold``'s file exists (returns at once without one)."""
    while args.hold and not os.path.exists(args.hold):
        time.sleep(0.1)
