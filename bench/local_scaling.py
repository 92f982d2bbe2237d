"""Local rendezvous + startup as the job grows: ``torchstep run`` vs ``torchx run -s
local_cwd`` of the same ``dist.ddp -j Nx2`` hello world for N = 1, 2, 4, 8 replicas (2, 4, 8,
16 processes on this machine), wall time of the whole command, runs alternated.

Usage: ``python bench/local_scaling.py [--runs N]`` (the scaling curve of docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "scripts"))
from agent_bench import BIN, clean_env  # noqa: E402
from figures import curve  # noqa: E402
from figures import runs as mode_runs  # noqa: E402

HELLO = "bench/_hello.py"
SIZES = (1, 2, 4, 8)


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=clean_env(), capture_output=True, text=True, check=False, timeout=600)
    if p.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(1, 3))
    runs = ap.parse_args().runs
    series: dict[str, list[tuple[float, float]]] = {"torchstep run": [], "torchx local_cwd": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in SIZES:
            j = f"{n}x2"
            cmds = {
                "torchstep run": [
                    str(BIN / "torchstep"),
                    "run",
                    "--log-dir",
                    tmp,
                    "-c",
                    "cpu_affinity=false",
                    "dist.ddp",
                    "--",
                    "-j",
                    j,
                    "--script",
                    HELLO,
                ],
                "torchx local_cwd": [
                    str(BIN / "torchx"),
                    "run",
                    "-s",
                    "local_cwd",
                    "-cfg",
                    f"log_dir={tmp}",
                    "dist.ddp",
                    "-j",
                    j,
                    "--script",
                    HELLO,
                ],
            }
            times: dict[str, list[float]] = {k: [] for k in cmds}
            for i in range(runs):
                for name in cmds if i % 2 == 0 else reversed(list(cmds)):
                    times[name].append(timed(cmds[name]))
            for name, ts in times.items():
                series[name].append((n, statistics.median(ts)))
            print(f"{j}: " + ", ".join(f"{k} {statistics.median(v):.2f} s" for k, v in times.items()), flush=True)
    curve(
        "local_scaling", "Local rendezvous + startup, dist.ddp -j Nx2 hello world", "replicas (x 2 processes)", series
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
