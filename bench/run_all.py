"""``make bench``: run every benchmark in bench/ and render docs/performance.md.

Quick mode by default (a few alternated runs each: about 10 minutes on 2 cores);
``BENCH_FULL=1`` for the long run. Each benchmark prints its ratio against the peer,
records its figures in bench/results.json (bench/scripts/figures.py) and its details in
bench/results/*.md; ``bench/report.py`` then writes docs/performance.md with the table and
the scaling plots. Benchmarks are not timed tests: ``make test`` never runs them.

Usage: ``python bench/run_all.py [name ...]`` (names without .py, default: all).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOT_BENCHMARKS = {"run_all", "report"}


def main() -> int:
    wanted = set(sys.argv[1:])
    scripts = sorted(p for p in HERE.glob("*.py") if p.stem not in NOT_BENCHMARKS and not p.name.startswith("_"))
    unknown = wanted - {p.stem for p in scripts}
    if unknown:
        print(f"unknown benchmark(s): {', '.join(sorted(unknown))}; have: {', '.join(p.stem for p in scripts)}")
        return 2
    mode = "full" if os.environ.get("BENCH_FULL", "") not in ("", "0") else "quick"
    print(f"make bench: {mode} mode", flush=True)
    failed = []
    t0 = time.monotonic()
    for script in scripts:
        if wanted and script.stem not in wanted:
            continue
        print(f"=== {script.stem}", flush=True)
        started = time.monotonic()
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent, check=False).returncode:
            failed.append(script.stem)
        print(f"=== {script.stem}: {time.monotonic() - started:.0f} s", flush=True)
    subprocess.run([sys.executable, str(HERE / "report.py")], cwd=HERE.parent, check=True)
    print(f"make bench: {time.monotonic() - t0:.0f} s in all ({mode} mode)")
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
