"""Agent startup: wall time of a 2-worker gloo hello-world under torchstep-agent vs
torchrun, same script, runs alternated after one warm-up each; prints the median ratio.

Usage: ``python bench/agent_startup.py [--runs N]``. Writes its section of
bench/results/agent.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import AGENT, SCRIPTS, TORCH_ROW, TORCHRUN, clean_env, figure_id, machine, median, update_section
from figures import drop, record
from figures import runs as mode_runs

HELLO = str(SCRIPTS / "agent_hello.py")


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, check=False, timeout=300)
    elapsed = time.perf_counter() - t0
    if p.returncode != 0 or "hello from rank 1 of 2" not in p.stdout + p.stderr:
        raise SystemExit(f"{argv[0]} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(3, 9))
    runs = ap.parse_args().runs
    command = f"{f'BENCH_TORCH_ROW={TORCH_ROW} ' if TORCH_ROW else ''}python bench/agent_startup.py --runs {runs}"
    exec_ = "torchstep-agent --no-zygote"
    times: dict[str, list[float]] = {"torchrun": [], "torchstep-agent": [], exec_: []}
    with tempfile.TemporaryDirectory() as tmp:
        commands = {
            "torchrun": [TORCHRUN, "--nproc-per-node", "2", HELLO],
            "torchstep-agent": [AGENT, "--nproc-per-node", "2", "--log-dir", f"{tmp}/logs", HELLO],
            exec_: [AGENT, "--no-zygote", "--nproc-per-node", "2", "--log-dir", f"{tmp}/logs", HELLO],
        }
        for argv in commands.values():
            timed(argv)  # warm-up: page cache, bytecode
        for i in range(runs):
            order = list(commands) if i % 2 == 0 else list(reversed(commands))
            for name in order:
                times[name].append(timed(commands[name]))
    ratio = median(times["torchstep-agent"]) / median(times["torchrun"])
    ratio_x = median(times[exec_]) / median(times["torchrun"])
    rows = "\n".join(f"| {n} | {median(t):.2f} | {min(t):.2f} | {max(t):.2f} |" for n, t in times.items())
    print(rows)
    print(f"startup ratio torchstep-agent / torchrun: {ratio:.2f} (goal <= 0.5)")
    record(
        figure_id("1"),
        "agent startup, 2-worker gloo hello world (wall time; the default: workers forked from the zygote)",
        times["torchstep-agent"],
        times["torchrun"],
        peer_name="torchrun",
        goal=0.5,
        command=command,
        note="no flag: workers forked from a process that imported torch once (docs/agent.md, Worker zygote)",
    )
    print(f"startup ratio torchstep-agent --no-zygote / torchrun: {ratio_x:.2f} (goal <= 0.8)")
    record(
        figure_id("1e"),
        "agent startup with --no-zygote (every worker exec'd), 2-worker gloo hello world",
        times[exec_],
        times["torchrun"],
        peer_name="torchrun",
        goal=0.8,
        command=command,
        note="every worker a new interpreter importing torch, as under torchrun",
    )
    drop("1z")  # what figure 1 now measures (the zygote became the default)
    update_section(
        figure_id("agent_startup"),
        f"""
## Startup

`{command}` — 2 workers, gloo hello-world
(`bench/scripts/agent_hello.py`), wall time of the whole command.

| command | median s | min s | max s |
|---|---|---|---|
{rows}

- **startup ratio torchstep-agent / torchrun: {ratio:.2f}** (the default: the worker zygote; goal <= 0.5)
- startup ratio torchstep-agent --no-zygote / torchrun: {ratio_x:.2f} (every worker exec'd)

{machine()}
""",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
