"""Log throughput of the launcher: each of 2 ranks prints a fixed count of numbered lines
(~90 bytes) as fast as it can (bench/scripts/throughput_worker.py flood); the figure is the
lines/s per rank that reach both the console and the rank files intact, from the rank's
first line to the moment the last rank's end marker reached the console.
torchstep-agent vs ``torchrun --tee 3 --log-dir``, same script, runs alternated. A line of
torchstep-agent lost, duplicated or torn fails the benchmark.

Usage: ``python bench/log_throughput.py [--runs N] [--lines N]`` (figure 10 of
docs/performance.md). Writes bench/results/throughput.md (its section).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import figure_id, machine, median, row_command
from figures import full, record
from figures import runs as mode_runs
from throughput_bench import NAMES, check, command, finish, run, update_section, worker_info


def one(name: str, tmp: Path, k: int, lines: int) -> tuple[float, float, str]:
    """One run: (intact lines/s per rank, seconds to the console's last line, problems)."""
    out, logs, console = tmp / f"out{k}", tmp / f"logs{k}", tmp / f"console{k}"
    out.mkdir()
    markers = tuple(f"TSEND r={r}\n".encode() for r in range(2))
    launch = run(command(name, logs, ["flood", "--out", str(out), "--lines", str(lines)]), console, markers=markers)
    end = finish(launch)
    info = worker_info(out)
    first = min(i["first"] for i in info.values())
    # the console's last line; a marker that never came: the launcher's exit
    last = max(launch.seen.get(m, end) for m in markers)
    elapsed = last - first
    c = check(console.read_bytes(), logs, out)
    per_rank = sum(c.intact(r) for r in c.printed) / len(c.printed) / elapsed
    problems = c.problems()
    if problems:
        print(f"!!! {name}: LINES LOST OR DAMAGED: {problems}", flush=True)
    return per_rank, elapsed, problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(2, 5))
    ap.add_argument("--lines", type=int, default=1_000_000 if full() else 400_000, help="lines per rank")
    a = ap.parse_args()
    rate: dict[str, list[float]] = {n: [] for n in NAMES}
    secs: dict[str, list[float]] = {n: [] for n in NAMES}
    problems: dict[str, list[str]] = {n: [] for n in NAMES}
    with tempfile.TemporaryDirectory() as tmp:
        k = 0
        for i in range(a.runs):
            for name in NAMES if i % 2 == 0 else reversed(NAMES):
                r, s, bad = one(name, Path(tmp), k, a.lines)
                k += 1
                rate[name].append(r)
                secs[name].append(s)
                if bad:
                    problems[name].append(bad)
                print(f"{name}: {r:,.0f} intact lines/s per rank ({a.lines:,} lines per rank in {s:.2f} s)", flush=True)
    ours, peer = "torchstep-agent", "torchrun"
    ratio = median(rate[ours]) / median(rate[peer])
    lines = {
        n: f"{len(problems[n])} of {a.runs} runs lost or damaged lines ({'; '.join(problems[n])})"
        if problems[n]
        else f"every line once in console and files in {a.runs} runs"
        for n in NAMES
    }
    cmd = row_command(f"python bench/log_throughput.py --runs {a.runs} --lines {a.lines}")
    print(f"log throughput ratio torchstep-agent / torchrun: {ratio:.2f} (goal >= 1.0)")
    record(
        figure_id("10"),
        "log throughput: lines/s per rank intact in the console and the rank files, 2 ranks printing flat out",
        rate[ours],
        rate[peer],
        peer_name="torchrun --tee 3 --log-dir",
        goal=1.0,
        better="higher",
        unit="lines/s",
        command=cmd,
        valid=not problems[ours],
        note=f"torchstep-agent: {lines[ours]}; torchrun: {lines[peer]}",
    )
    rows = "\n".join(
        f"| {n} | {median(rate[n]):,.0f} | {min(rate[n]):,.0f}-{max(rate[n]):,.0f} | {median(secs[n]):.2f} | {lines[n]} |"
        for n in NAMES
    )
    update_section(
        figure_id("log_throughput"),
        f"""
## Log throughput

`{cmd}` — 2 ranks each print {a.lines:,} numbered lines of ~90 bytes as fast as they
can (`bench/scripts/throughput_worker.py flood`, Python's buffered stdout); both launchers
run `--nproc-per-node 2 --tee 3 --log-dir DIR`. A rank's rate is its lines present exactly
once in both the console capture and its `stdout.log`, over the time from its first line to
the arrival of the last rank's end marker on the console.

| launcher | intact lines/s per rank (median) | min-max | seconds to the console's last line | lines |
|---|---|---|---|---|
{rows}

- **log throughput: {ratio:.2f}x torchrun** (goal >= 1.0)

{machine()}
""",
    )
    return 1 if problems[ours] else 0


if __name__ == "__main__":
    sys.exit(main())
