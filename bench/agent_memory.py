"""Peak memory of the launcher process itself (workers excluded): torchstep-agent vs
torchrun running the same 2-worker gloo hello world that sleeps 2 s. The peak resident set
(``VmHWM`` of ``/proc/<pid>/status``) is read until the process exits.

Usage: ``python bench/agent_memory.py [--runs N]`` (figure 8 of docs/performance.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import AGENT, TORCHRUN, clean_env, figure_id, median, row_command
from figures import record
from figures import runs as mode_runs

WORKER = "import time, torch.distributed as d; d.init_process_group('gloo'); d.barrier(); time.sleep(2); d.destroy_process_group()"


def peak_rss_mib(argv: list[str]) -> float:
    """The launcher's own peak RSS in MiB (its workers are other processes)."""
    proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peak = 0
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        except OSError:
            break
        time.sleep(0.05)
    if proc.wait() != 0:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode})")
    return peak / 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(3, 7))
    runs = ap.parse_args().runs
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "w.py"
        script.write_text(WORKER)
        commands = {
            "torchrun": [TORCHRUN, "--nproc-per-node", "2", str(script)],
            "torchstep-agent": [AGENT, "--nproc-per-node", "2", "--log-dir", f"{tmp}/logs", str(script)],
        }
        rss: dict[str, list[float]] = {n: [] for n in commands}
        for i in range(runs):
            for name in commands if i % 2 == 0 else reversed(list(commands)):
                rss[name].append(peak_rss_mib(commands[name]))
    print(", ".join(f"{n}: median {median(v):.0f} MiB" for n, v in rss.items()))
    record(
        figure_id("8"),
        "peak RSS of the launcher process (workers excluded), 2-worker gloo job",
        rss["torchstep-agent"],
        rss["torchrun"],
        peer_name="torchrun",
        goal=1.1,
        unit="MiB",
        command=row_command(f"python bench/agent_memory.py --runs {runs}"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
