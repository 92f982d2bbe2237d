"""Where a worker (re)start's time goes: the pieces every new worker process pays before
its first barrier — the interpreter, ``import torch``, ``import torch.distributed`` and a
2-rank gloo ``init_process_group`` — each measured alone (medians, 2 processes at once as
in the startup and recovery figures), against the measured startup and recovery of
figures 1e and 2e (``--no-zygote``: every worker a new process, as under torchrun), then
what the default (figures 1 and 2: the worker zygote) saves. Writes bench/results/analysis.md, which docs/performance.md includes.

Usage: ``python bench/startup_profile.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "scripts"))
from agent_bench import clean_env  # noqa: E402
from figures import RESULTS_JSON  # noqa: E402
from figures import runs as mode_runs  # noqa: E402

PIECES = {
    "interpreter start (python -c pass)": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "import torch.distributed": [sys.executable, "-c", "import torch.distributed"],
}


def alone(argv: list[str]) -> float:
    """Wall time of one fresh process."""
    t0 = time.perf_counter()
    if subprocess.run(argv, env=clean_env(), check=False).returncode:
        raise SystemExit(f"{argv} failed")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=mode_runs(3, 7))
    runs = ap.parse_args().runs
    got = {name: statistics.median(alone(argv) for _ in range(runs)) for name, argv in PIECES.items()}
    figures = json.loads(RESULTS_JSON.read_text()).get("figures", {}) if RESULTS_JSON.exists() else {}
    startup = figures.get("1e", {})
    recovery = figures.get("2e", {})
    lines = [
        "## Where the (re)start time goes",
        "",
        f"`python bench/startup_profile.py --runs {runs}` — each piece one fresh process, median wall time "
        "(a 2-worker group pays it in both workers at once, on 2 cores):",
        "",
        "| piece | median |",
        "|---|---|",
        *[f"| {name} | {s * 1000:.0f} ms |" for name, s in got.items()],
        "",
    ]
    if startup.get("ours", {}).get("median") and recovery.get("ours", {}).get("median"):
        s_ours, s_peer = startup["ours"]["median"], startup["peer"]["median"]
        r_ours, r_peer = recovery["ours"]["median"], recovery["peer"]["median"]
        lines += [
            f"With every worker a new process (`--no-zygote`), startup (figure 1e): torchstep-agent {s_ours:.2f} s, "
            f"torchrun {s_peer:.2f} s; recovery (figure 2e): torchstep-agent {r_ours:.2f} s, {recovery.get('peer_name', 'torchrun')} {r_peer:.2f} s from the crash to "
            "the restarted group's first "
            "barrier. Both tools pay the same pieces: the launcher imports torch before it starts a worker, and "
            "every new worker process starts an interpreter and imports torch again before `init_process_group`; "
            "on a restart, detecting the failure (monitor interval 0.1 s), stopping the survivors and the next "
            "rendezvous round add little next to a fresh worker's imports. (The pieces above are measured alone, "
            "at other moments than the figures, so they do not add up exactly.)",
            "",
            "So the remaining startup and recovery time is dominated by what every new worker process pays to "
            "import torch, and torchstep already pays no more than torchrun for the rest. The worker zygote "
            "(on by default, docs/agent.md) removes that piece: workers are forked from a process "
            "that imported torch once, so a restart costs a fork instead of an interpreter and an import.",
        ]
        zs, zr = figures.get("1", {}), figures.get("2", {})
        if zs.get("ours", {}).get("median") and zr.get("ours", {}).get("median"):
            lines += [
                "",
                f"With the zygote (the default): startup (figure 1) {zs['ours']['median']:.2f} s = "
                f"{zs['ratio']:.2f}x torchrun, recovery (figure 2) {zr['ours']['median']:.2f} s = {zr['ratio']:.2f}x "
                f"{zr.get('peer_name', 'torchrun')} (goals 0.5x and 0.25x).",
            ]
    out = HERE / "results" / "analysis.md"
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
