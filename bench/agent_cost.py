"""The launcher's own cost while a job trains: CPU seconds per minute of training of the
launcher process alone (``utime + stime`` of ``/proc/<pid>/stat``; its workers, and the
agent's worker zygote, are other processes) and its resident set (``VmRSS``) over a long run
in which every rank trains DDP and prints 2,000 numbered lines/s
(bench/scripts/throughput_worker.py train --seconds). torchstep-agent vs
``torchrun --tee 3 --log-dir``, one run each, alternated across runs. Quick mode trains 30 s
per run; ``BENCH_FULL=1`` 10 minutes, where the goal is a flat RSS: no growth beyond 5 MiB
from minute 1 to the end. Every line is counted in the console and the rank files.

Usage: ``python bench/agent_cost.py [--runs N] [--seconds S]`` (figures 11a and 11b of
docs/performance.md). Writes bench/results/throughput.md (its section).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import figure_id, machine, median, row_command
from figures import full, record
from figures import runs as mode_runs
from throughput_bench import NAMES, check, command, finish, run, update_section

RATE = 2000
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` alone (not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(name: str, tmp: Path, k: int, seconds: float, settle: float) -> dict:
    """One run: the launcher's CPU s/min over the training and its RSS samples."""
    out, logs, console = tmp / f"out{k}", tmp / f"logs{k}", tmp / f"console{k}"
    out.mkdir()
    args = ["train", "--out", str(out), "--seconds", str(seconds), "--rate", str(RATE)]
    launch = run(command(name, logs, args), console, timeout=seconds + 300)
    pid = launch.proc.pid
    while not (out / "started").exists():  # the warm-up is over: training from here
        if launch.proc.poll() is not None:
            break
        time.sleep(0.05)
    t0, cpu0 = time.monotonic(), cpu_seconds(pid)
    samples: list[tuple[float, float]] = []  # (seconds into training, RSS MiB)
    t1, cpu1 = t0, cpu0
    while launch.proc.poll() is None:
        try:
            now, cpu, rss = time.monotonic(), cpu_seconds(pid), rss_mib(pid)
        except (OSError, ValueError, IndexError):
            break
        if now - t0 <= seconds:  # stop at the training's end: exit work is not training
            t1, cpu1 = now, cpu
            samples.append((now - t0, rss))
        time.sleep(0.5)
    finish(launch)
    c = check(console.read_bytes(), logs, out)
    problems = c.problems()
    if problems:
        print(f"!!! {name}: LINES LOST OR DAMAGED at {RATE} lines/s per rank: {problems}", flush=True)
    after = [r for t, r in samples if t >= settle]
    return {
        "cpu_per_min": (cpu1 - cpu0) / max(t1 - t0, 1e-9) * 60,
        "rss_start": after[0] if after else float("nan"),
        "rss_end": after[-1] if after else float("nan"),
        "rss_max": max(after, default=float("nan")),
        "growth": (after[-1] - after[0]) if after else float("nan"),
        "trained": t1 - t0,
        "problems": problems,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(1, 1))
    ap.add_argument("--seconds", type=float, default=600 if full() else 30, help="training seconds per run")
    a = ap.parse_args()
    settle = 60.0 if a.seconds >= 120 else a.seconds / 3  # "from minute 1": past start-up allocations
    res: dict[str, list[dict]] = {n: [] for n in NAMES}
    with tempfile.TemporaryDirectory() as tmp:
        k = 0
        for i in range(a.runs):
            for name in NAMES if i % 2 == 0 else reversed(NAMES):
                r = one(name, Path(tmp), k, a.seconds, settle)
                k += 1
                res[name].append(r)
                print(
                    f"{name}: {r['cpu_per_min']:.2f} CPU s/min, RSS {r['rss_start']:.1f} -> {r['rss_end']:.1f} MiB "
                    f"(max {r['rss_max']:.1f}) over {r['trained']:.0f} s",
                    flush=True,
                )
    ours, peer = "torchstep-agent", "torchrun"
    cpu = {n: [r["cpu_per_min"] for r in res[n]] for n in NAMES}
    growth = {n: [r["growth"] for r in res[n]] for n in NAMES}
    bad = {n: [r["problems"] for r in res[n] if r["problems"]] for n in NAMES}
    lines = {
        n: f"{len(bad[n])} of {a.runs} runs lost or damaged lines ({'; '.join(bad[n])})"
        if bad[n]
        else f"every line once in console and files in {a.runs} run(s)"
        for n in NAMES
    }
    cmd = row_command(f"python bench/agent_cost.py --runs {a.runs} --seconds {a.seconds:g}")
    span = f"{settle:.0f} s to {a.seconds:.0f} s of training"
    ratio = median(cpu[ours]) / median(cpu[peer])
    print(f"launcher CPU s per minute of training, torchstep-agent / torchrun: {ratio:.2f} (goal <= 1.0)")
    record(
        figure_id("11a"),
        f"launcher's own CPU seconds per minute of DDP training, every rank printing {RATE:,} lines/s",
        cpu[ours],
        cpu[peer],
        peer_name="torchrun --tee 3 --log-dir",
        goal=1.0,
        unit="CPU s/min",
        command=cmd,
        note=f"workers and the zygote excluded; torchstep-agent: {lines[ours]}; torchrun: {lines[peer]}",
    )
    print(
        f"launcher RSS growth from {span}: torchstep-agent {median(growth[ours]):+.1f} MiB (goal <= 5 MiB), "
        f"torchrun {median(growth[peer]):+.1f} MiB"
    )
    record(
        figure_id("11b"),
        f"launcher's RSS growth from {span} at {RATE:,} lines/s per rank",
        growth[ours],
        growth[peer],
        peer_name="torchrun --tee 3 --log-dir",
        goal=5.0,
        goal_on="ours",
        unit="MiB",
        command=cmd,
        valid=not bad[ours],
        note="the 10-minute run is BENCH_FULL=1; quick mode trains " + f"{a.seconds:.0f} s",
    )
    rows = "\n".join(
        f"| {n} | {r['cpu_per_min']:.2f} | {r['rss_start']:.1f} | {r['rss_end']:.1f} | {r['rss_max']:.1f} | "
        f"{r['growth']:+.1f} | {r['trained']:.0f} |"
        for n in NAMES
        for r in res[n]
    )
    update_section(
        figure_id("agent_cost"),
        f"""
## The launcher's own cost

`{cmd}` — DDP training as in the training benchmark, every rank printing {RATE:,}
numbered lines/s for {a.seconds:.0f} s after the warm-up; the launcher process alone is
sampled every 0.5 s (`/proc/<pid>/stat` utime + stime, `/proc/<pid>/status` VmRSS).
Growth is from {settle:.0f} s of training to the end.

| launcher | CPU s per minute of training | RSS at {settle:.0f} s (MiB) | RSS at the end | max | growth | seconds trained |
|---|---|---|---|---|---|---|
{rows}

- **CPU: {ratio:.2f}x torchrun** (goal <= 1.0)
- **RSS growth: {median(growth[ours]):+.1f} MiB** (goal <= 5 MiB; torchrun {median(growth[peer]):+.1f} MiB)
- lines: torchstep-agent: {lines[ours]}; torchrun: {lines[peer]}

{machine()}
""",
    )
    return 1 if bad[ours] else 0


if __name__ == "__main__":
    sys.exit(main())
