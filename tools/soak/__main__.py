"""``python -m tools.soak``: run a seeded fault campaign (``make soak``)."""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

from tools.soak import campaign, faults, report
from tools.soak.model import Run

ROOT = Path(__file__).resolve().parent.parent.parent


def main(argv: list[str] | None = None) -> int:
    """Plan, run and report a campaign.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when every run held every invariant, 1 otherwise.
    """
    p = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__)
    p.add_argument(
        "--faults",
        type=int,
        default=int(os.environ.get("SOAK_FAULTS", "100")),
        help="campaign size (env SOAK_FAULTS, default 100)",
    )
    p.add_argument("--seed", type=int, default=None, help="the seed (env SOAK_SEED, default random)")
    p.add_argument("--only", type=int, default=None, metavar="RUN_INDEX", help="replay one run of the campaign")
    p.add_argument("--replay", default=None, metavar="SURFACE:FAULT:MOMENT[:RANK]", help="run just this")
    p.add_argument("--surface", action="append", help="draw only from these surfaces")
    p.add_argument(
        "--report", default=str(ROOT / "docs" / "reliability.md"), help="the page a full campaign writes ('' for none)"
    )
    p.add_argument("--keep", action="store_true", help="keep every run's directory")
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=float(os.environ.get(faults.HANG_ENV) or 0),
        metavar="S",
        help="run every agent with --hang-timeout S (env SOAK_HANG_TIMEOUT; default off) and count its stops",
    )
    a = p.parse_args(argv)
    if a.hang_timeout < 0:
        p.error(f"--hang-timeout must be > 0 seconds (0: off), got {a.hang_timeout:g}")
    if a.hang_timeout:
        os.environ[faults.HANG_ENV] = f"{a.hang_timeout:g}"  # read by every surface's run (faults.tail_env)
    else:
        os.environ.pop(faults.HANG_ENV, None)
    seed = a.seed if a.seed is not None else int(os.environ.get("SOAK_SEED") or random.SystemRandom().randrange(10**6))
    print(f"SOAK_SEED={seed}", flush=True)
    if a.replay:
        runs = [Run.parse(a.replay)]
    else:
        runs = campaign.plan(seed, a.faults, a.surface)
        if a.only is not None:
            runs = [r for r in runs if r.index == a.only]
    started = time.monotonic()
    outcomes = campaign.execute(runs, seed, say=lambda s: print(s, flush=True), keep=a.keep)
    wall = time.monotonic() - started
    broken = sum(1 for o in outcomes if o.violations)
    skipped = sum(1 for o in outcomes if o.skipped)
    print(
        f"soak: {len(outcomes) - broken - skipped} of {len(outcomes) - skipped} runs held every invariant in "
        f"{wall:.0f} s (seed {seed})" + (f"; {skipped} skipped (their surface cannot run here)" if skipped else "")
    )
    if a.hang_timeout:
        stopped = [o for o in outcomes if faults.hang_stops(o.observation.result, o.observation.console)]
        real = [o for o in stopped if o.run.fault == "stop"]
        print(
            f"soak: --hang-timeout {a.hang_timeout:g}s stopped {len(stopped)} of {len(outcomes)} runs: "
            f"{len(real)} under the injected hang (stop), {len(stopped) - len(real)} false positives"
            + "".join(f"\n    false positive: run {o.run.index} {o.run.key}" for o in stopped if o.run.fault != "stop")
        )
    if a.report and a.only is None and not a.replay:
        page = Path(a.report)
        if a.surface and page.exists():  # one surface's campaign: its rows and section, the rest kept
            page.write_text(report.update(page.read_text(), outcomes, seed, a.faults, wall, a.surface))
        else:
            page.write_text(report.render(outcomes, seed, a.faults, wall))
        print(f"soak: wrote {a.report}")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
