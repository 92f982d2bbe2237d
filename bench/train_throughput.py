"""Training throughput under the launcher: steady-state DDP training (gloo, 2 ranks, an MLP
whose step takes about 50 ms on one core) under torchstep-agent vs torchrun, same script,
runs alternated. Each run measures, inside rank 0 by wall clock after 20 warm-up steps, one
window of plain training and one where every rank also prints 2,000 numbered lines/s
(bench/scripts/throughput_worker.py). Both launchers run with ``--tee 3 --log-dir`` and
every numbered line is counted in the console and in the rank files: a lost, duplicated or
torn line of torchstep-agent fails the benchmark.

Usage: ``python bench/train_throughput.py [--runs N] [--steps N]`` (figures 9a and 9b of
docs/performance.md). Writes bench/results/throughput.md (its section).

``--hang-timeout S`` instead runs torchstep-agent with and without ``--hang-timeout S``,
alternated (no torchrun, no figure): every run with it on must end SUCCEEDED (a hang stop of
this healthy training is a false positive), and the section ``train_throughput_hang`` says
how many runs and steps, how many hang stops, the throughput on vs off, the slowest step
and the longest silence (the worker's start to its first line: the plain window prints
nothing, and DDP's gradient all-reduce runs in C++, where the collective hook cannot see it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import figure_id, machine, median, row_command
from figures import full, record
from figures import runs as mode_runs
from throughput_bench import NAMES, check, command, finish, run, update_section, worker_info

HANG_NAMES = ("--hang-timeout on", "--hang-timeout off")

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


def one_hang(on: bool, hang_s: float, tmp: Path, k: int, steps: int) -> dict:
    """One torchstep-agent run with ``--hang-timeout`` on or off: its rates, whether it
    succeeded, the agent's hang stops (ranks with reason ``hang_timeout`` in its result), the
    ranks' longest silence and slowest step."""
    out, logs, console = tmp / f"out{k}", tmp / f"logs{k}", tmp / f"console{k}"
    out.mkdir()
    result = tmp / f"result{k}.json"
    args = ["train", "--out", str(out), "--steps", str(steps), "--rate", str(RATE), "--windows", "plain,log"]
    argv = command("torchstep-agent", logs, args)
    flags = ["--result-file", str(result)] + (["--hang-timeout", f"{hang_s:g}"] if on else [])
    argv[1:1] = flags
    launch = run(argv, console)
    try:
        rc = launch.proc.wait(timeout=launch.timeout)
    except subprocess.TimeoutExpired:
        launch.proc.kill()
        rc = launch.proc.wait()
    launch.reader.join()
    res = json.loads(result.read_text()) if result.exists() else {}
    ranks = [r for rep in res.get("replicas", []) for r in rep.get("ranks", [])]
    info = worker_info(out)
    windows = info[0]["windows"] if 0 in info else []
    rate = {w["kind"]: w["steps"] / w["seconds"] for w in windows}
    return {
        "ok": rc == 0 and res.get("state") == "SUCCEEDED",
        "rc": rc,
        "hang_stops": sum(1 for r in ranks if r.get("reason") == "hang_timeout"),
        "message": res.get("message", ""),
        "plain": rate.get("plain"),
        "log": rate.get("log"),
        "steps": sum(w["steps"] for w in windows) + 20,  # + the warm-up
        "silent_s": max((i.get("silent_s", 0.0) for i in info.values()), default=0.0),
        "slowest_step_s": max((i.get("slowest_step_s", 0.0) for i in info.values()), default=0.0),
    }


def main_hang(runs: int, steps: int, hang_s: float) -> int:
    """``--hang-timeout S``: the runs, the section ``train_throughput_hang``; 1 on any false positive."""
    got: dict[str, list[dict]] = {n: [] for n in HANG_NAMES}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        k = 0
        for i in range(runs):
            for name in HANG_NAMES if i % 2 == 0 else reversed(HANG_NAMES):
                r = one_hang(name == HANG_NAMES[0], hang_s, Path(tmp), k, steps)
                k += 1
                got[name].append(r)
                print(
                    f"{name}: rc {r['rc']}, {r['hang_stops']} hang stops, {r['plain'] or 0:.2f} steps/s plain, "
                    f"{r['log'] or 0:.2f} at {RATE} lines/s, silent {r['silent_s']:.1f}s, slowest step "
                    f"{r['slowest_step_s'] * 1000:.0f} ms" + ("" if r["ok"] else f": FAILED {r['message']}"),
                    flush=True,
                )
    load_after = os.getloadavg()
    on, off = got[HANG_NAMES[0]], got[HANG_NAMES[1]]
    stops = sum(r["hang_stops"] for r in on)
    failed = [r for r in on + off if not r["ok"]]

    def med(rs: list[dict], key: str) -> float:
        values = [r[key] for r in rs if r[key]]
        return median(values) if values else float("nan")

    def span(rs: list[dict], key: str) -> str:
        values = [r[key] for r in rs if r[key]]
        return f"{min(values):.1f}-{max(values):.1f}" if values else "none"

    ratio_p, ratio_l = med(on, "plain") / med(off, "plain"), med(on, "log") / med(off, "log")
    silent = max(r["silent_s"] for r in on + off)
    slowest = max(r["slowest_step_s"] for r in on + off)
    cmd = row_command(f"python bench/train_throughput.py --hang-timeout {hang_s:g} --runs {runs} --steps {steps}")
    print(f"--hang-timeout {hang_s:g}s: {stops} hang stops in {len(on)} runs; throughput on/off {ratio_p:.3f} plain")
    update_section(
        figure_id("train_throughput_hang"),
        f"""
## Training throughput with `--hang-timeout`

`{cmd}` — the worker of the section above, under torchstep-agent with and without
`--hang-timeout {hang_s:g}`, alternated: {len(on)} + {len(off)} runs, {sum(r["steps"] for r in on)}
training steps with it on.

- **hang stops: {stops}** ({"no false positive" if not stops else "FALSE POSITIVES"}); runs that did not
  succeed: {len(failed)}
- throughput with it on / off: **{ratio_p:.3f}x plain, {ratio_l:.3f}x at {RATE:,} lines/s per rank**
  (medians; plain steps/s on {span(on, "plain")}, off {span(off, "plain")}; load average
  {load_before[0]:.1f} before, {load_after[0]:.1f} after, on 2 cores shared with other work)
- slowest training step {slowest * 1000:.0f} ms; longest silence {silent:.1f} s (the worker's start
  to its first line: import, rendezvous, 20 warm-up and {steps} plain steps print nothing, and DDP's
  gradient all-reduce runs in C++, which the collective hook does not see): `--hang-timeout` must
  exceed that silence, not a few steps

{machine()}
""",
    )
    return 1 if stops or failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(2, 5))
    ap.add_argument("--steps", type=int, default=300 if full() else 80, help="steps per timed window")
    ap.add_argument(
        "--hang-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="compare torchstep-agent with and without --hang-timeout S instead (counts hang stops)",
    )
    a = ap.parse_args()
    if a.hang_timeout < 0:
        ap.error(f"--hang-timeout must be > 0 seconds, got {a.hang_timeout:g}")
    if a.hang_timeout:
        return main_hang(a.runs, a.steps, a.hang_timeout)
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
    cmd = row_command(f"python bench/train_throughput.py --runs {a.runs} --steps {a.steps}")
    print(f"training steps/s ratio torchstep-agent / torchrun: {ratio_p:.3f} (goal >= 0.99)")
    record(
        figure_id("9a"),
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
        figure_id("9b"),
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
        figure_id("train_throughput"),
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
