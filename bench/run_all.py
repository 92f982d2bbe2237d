"""Run every benchmark in bench/ (not part of `make test`: benchmarks are not timed tests).

Each benchmark prints its ratio lines against the peer and updates bench/results/*.md.
Usage: ``python bench/run_all.py [name ...]`` (names without .py, default: all).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    wanted = set(sys.argv[1:])
    scripts = sorted(p for p in HERE.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_"))
    failed = []
    for script in scripts:
        if wanted and script.stem not in wanted:
            continue
        print(f"=== {script.stem}", flush=True)
        if subprocess.run([sys.executable, str(script)], cwd=HERE.parent, check=False).returncode:
            failed.append(script.stem)
    if failed:
        print(f"benchmarks that failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
