"""A one-rank step for the KubernetesPodOperator path: prints a line, holds ``--hold`` seconds
(a drain can catch it running), then publishes ``answer`` or, with ``--fail``, raises the
error the task must name as its root cause."""

import argparse
import time

import torchstep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--fail", action="store_true")
    args = p.parse_args()
    print("kpo step running", flush=True)
    time.sleep(args.hold)
    if args.fail:
        raise ValueError("bad batch 7: loss is nan")
    torchstep.output("answer", 42)


if __name__ == "__main__":
    main()
