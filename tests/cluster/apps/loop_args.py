"""The training loops' shared command line (``--steps``, ``--interval``, ``--stop-s``), and
``--stop-s``: on SIGTERM, take that long to stop (a final checkpoint, as trainers do)."""

import argparse
import signal
import time


def parse(description: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--interval", type=float, default=0.25)
    p.add_argument("--stop-s", type=float, default=0.0, help="on SIGTERM, take this long to stop")
    args = p.parse_args()
    if args.stop_s > 0:
        signal.signal(signal.SIGTERM, lambda *_: _stop_slowly(args.stop_s))
    return args


def _stop_slowly(seconds: float) -> None:
    print(f"SIGTERM: stopping within {seconds:g} s", flush=True)
    time.sleep(seconds)
    raise SystemExit(143)
