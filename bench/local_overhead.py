"""Overhead of the local target: wall time of a 1-role, 2-process hello-world (gloo, CPU).

    plain torchrun     torchrun --nproc-per-node 2 bench/_hello.py
    torchx local_cwd   torchx run -s local_cwd dist.ddp -j 1x2 --script bench/_hello.py
    torchstep run      torchstep run dist.ddp -- -j 1x2 --script bench/_hello.py

torchx and torchstep run the same AppDef (TorchX's dist.ddp: ``bash -c "torchrun ..."``),
torchstep through its torchrun shim and agent. Runs are interleaved (noise hits all three
alike) and the medians compared. Writes bench/results/local.md.

Usage: ``python bench/local_overhead.py [--runs N]`` from the repository root.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE / "scripts"))
from figures import record, runs  # noqa: E402

BIN = Path(sys.executable).parent
HELLO = "bench/_hello.py"


def commands(log_dir: str) -> dict[str, list[str]]:
    return {
        "torchrun": [str(BIN / "torchrun"), "--nproc-per-node", "2", HELLO],
        "torchx": [str(BIN / "torchx"), "run", "-s", "local_cwd", "dist.ddp", "-j", "1x2", "--script", HELLO],
        "torchstep": [
            str(BIN / "torchstep"),
            "run",
            "dist.ddp",
            "--log-dir",
            log_dir,
            "--",
            "-j",
            "1x2",
            "--script",
            HELLO,
        ],
    }


def timed(argv: list[str]) -> float:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.perf_counter()
    p = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    # torchx exits 1 when the app fails and keeps the ranks' output in its log files
    shown = Path(argv[0]).name == "torchx" or "hello from rank 1 of 2" in p.stdout + p.stderr
    if p.returncode != 0 or not shown:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=runs(3, 7))
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="torchstep-bench-") as logs:
        cmds = commands(logs)
        for argv in cmds.values():  # warm-up: page cache, .pyc files
            timed(argv)
        times: dict[str, list[float]] = {name: [] for name in cmds}
        for _ in range(ns.runs):
            for name, argv in cmds.items():
                times[name].append(timed(argv))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    ratio_tx = med["torchstep"] / med["torchx"]
    ratio_tr = med["torchstep"] / med["torchrun"]
    print(f"median wall time over {ns.runs} runs: " + ", ".join(f"{n} {t:.2f} s" for n, t in med.items()))
    print(f"torchstep / torchx local_cwd: {ratio_tx:.2f} (goal <= 1.0)")
    print(f"torchstep / plain torchrun:   {ratio_tr:.2f}")
    write_report(times, med, ratio_tx, ratio_tr, ns.runs)
    record(
        "4",
        "`torchstep run` vs `torchx run -s local_cwd`, dist.ddp -j 1x2 hello world (wall time)",
        times["torchstep"],
        times["torchx"],
        peer_name="torchx local_cwd",
        goal=1.0,
        command=f"python bench/local_overhead.py --runs {ns.runs}",
    )
    return 0


def write_report(
    times: dict[str, list[float]], med: dict[str, float], ratio_tx: float, ratio_tr: float, runs: int
) -> None:
    import torch  # noqa: F401 - version only
    import torchx

    rows = "\n".join(f"| {name} | {med[name]:.2f} | {min(ts):.2f} | {max(ts):.2f} |" for name, ts in times.items())
    text = f"""# Local target overhead

`python bench/local_overhead.py --runs {runs}` — a 1-role, 2-process gloo hello-world
(`bench/_hello.py`), wall time of the whole command, {runs} interleaved runs after one warm-up.

| command | median s | min s | max s |
|---|---|---|---|
{rows}

- **torchstep run / torchx run -s local_cwd: {ratio_tx:.2f}** (goal: <= 1.0)
- torchstep run / plain torchrun: {ratio_tr:.2f}

Commands: `torchrun --nproc-per-node 2 bench/_hello.py`;
`torchx run -s local_cwd dist.ddp -j 1x2 --script bench/_hello.py`;
`torchstep run dist.ddp -- -j 1x2 --script bench/_hello.py` (the same AppDef as torchx's,
its `torchrun` running as torchstep-agent through the shim).

Machine: {os.cpu_count()} CPU(s), {platform.machine()}, Python {platform.python_version()},
torch {sys.modules["torch"].__version__}, torchx {torchx.__version__}; other work may have
shared the machine.
"""
    out = HERE / "results" / "local.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(f"wrote {out.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
