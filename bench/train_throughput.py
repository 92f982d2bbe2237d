"""Training throughput under the launcher: steady-state DDP training (gloo, 2 ranks, an MLP
whose step takes about 50 ms on one core) under torchstep-agent vs torchrun, same script,
runs alternated. Each run measures, inside rank 0 by wall clock after 20 warm-up steps, one
window of plain training and one where every rank also prints 2,000 numbered lines/s
(bench/scripts/throughput_worker.py). Both launchers run with ``--tee 3 --log-dir`` and
every numbered line is counted in the console and in the rank files: a lost, duplicated or
torn line of torchstep-agent fails the benchmark.

Usage: ``python bench/train_throughput.py [--runs N] [--steps N]`` (figures 9a and 9b of
docs/performance.md). Writes bench/results/throughput.md (its section).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import machine, median
from figures import full, record
from figures import runs as mode_runs
from throughput_bench import NAMES, check, command, finish, run, update_section, worker_info

RATE = 2000


def one(name: str, tmp: Path, k: int, steps: int) -> tuple[float, float, str]:
    """One run: (plain steps/s, logging steps/s, line problems)."""
    out, logs, console = tmp / f"out{k}", tmp / f"logs{k}", tmp / f"console{k}"
    out.mkdir()
    args = ["train", "--out", str(out), "--steps", str(steps), "--rate", str(RATE), "--windows", "plain,log"]
    finish(run(command(name, logs, args), console))
    windows = worker_info(out)[0]["windows"]
    rate = {w["kind"]: w["steps"] / w["seconds"] for w in windows}
    problems = check(console.read_bytes(), logs, out).problems()
    if problems:
        print(f"!!! {name}: LINES LOST OR DAMAGED at {RATE} lines/s per rank: {problems}", flush=True)
    return rate["plain"], rate["log"], problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(2, 5))
    ap.add_argument("--steps", type=int, default=300 if full() else 80, help="steps per timed window")
    a = ap.parse_args()
    plain: dict[str, list[float]] = {n: [] for n in NAMES}
    logged: dict[str, list[float]] = {n: [] for n in NAMES}
    problems: dict[str, list[str]] = {n: [] for n in NAMES}
    with tempfile.TemporaryDirectory() as tmp:
        k = 0
        for i in range(a.runs):
            for name in NAMES if i % 2 == 0 else reversed(NAMES):
                p, lg, bad = one(name, Path(tmp), k, a.steps)
                k += 1
                plain[name].append(p)
                logged[name].append(lg)
                if bad:
                    problems[name].append(bad)
                print(f"{name}: {p:.2f} steps/s plain, {lg:.2f} steps/s at {RATE} lines/s per rank", flush=True)
    ours, peer = "torchstep-agent", "torchrun"
    ratio_p = median(plain[ours]) / median(plain[peer])
    ratio_l = median(logged[ours]) / median(logged[peer])
    step_ms = 1000 / median(plain[peer])
    lines = {
        n: f"{len(problems[n])} of {a.runs} runs lost or damaged lines ({'; '.join(problems[n])})"
        if problems[n]
        else f"every line once in console and files in {a.runs} runs"
        for n in NAMES
    }
    cmd = f"python bench/train_throughput.py --runs {a.runs} --steps {a.steps}"
    print(f"training steps/s ratio torchstep-agent / torchrun: {ratio_p:.3f} (goal >= 0.99)")
    record(
        "9a",
        f"DDP training steps/s (gloo, 2 ranks, ~{step_ms:.0f} ms/step), after warm-up",
        plain[ours],
        plain[peer],
        peer_name="torchrun",
        goal=0.99,
        better="higher",
        unit="steps/s",
        command=cmd,
        note="both launchers with --tee 3 --log-dir",
    )
    print(
        f"training steps/s at {RATE} lines/s per rank, ratio torchstep-agent / torchrun: {ratio_l:.3f} (goal >= 0.97)"
    )
    record(
        "9b",
        f"DDP training steps/s with every rank printing {RATE:,} lines/s; not one line lost",
        logged[ours],
        logged[peer],
        peer_name="torchrun --tee 3 --log-dir",
        goal=0.97,
        better="higher",
        unit="steps/s",
        command=cmd,
        valid=not problems[ours],
        note=f"torchstep-agent: {lines[ours]}; torchrun: {lines[peer]}",
    )
    rows = "\n".join(
        f"| {n} | {median(plain[n]):.2f} | {min(plain[n]):.2f}-{max(plain[n]):.2f} | "
        f"{median(logged[n]):.2f} | {min(logged[n]):.2f}-{max(logged[n]):.2f} | {lines[n]} |"
        for n in NAMES
    )
    spread = statistics.pstdev(plain[peer]) / median(plain[peer]) if len(plain[peer]) > 1 else 0.0
    update_section(
        "train_throughput",
        f"""
## Training throughput

`{cmd}` — DDP (gloo, 2 ranks, one thread each), MLP 4 x 768 x 768, batch 64
(`bench/scripts/throughput_worker.py train`); rank 0 times {a.steps} steps after 20
warm-up steps by wall clock, once plain and once with every rank printing {RATE:,}
numbered lines/s. Both launchers run `--nproc-per-node 2 --tee 3 --log-dir DIR`;
every line is counted in the console capture and in `DIR/*/attempt_*/<rank>/stdout.log`.

| launcher | plain steps/s (median) | min-max | steps/s at {RATE:,} lines/s | min-max | lines |
|---|---|---|---|---|---|
{rows}

- **plain: {ratio_p:.3f}x torchrun** (goal >= 0.99; torchrun's runs spread {spread:.1%})
- **at {RATE:,} lines/s per rank: {ratio_l:.3f}x torchrun** (goal >= 0.97, and not one line lost)

{machine()}
""",
    )
    return 1 if problems[ours] else 0


if __name__ == "__main__":
    sys.exit(main())
