"""Node loss: two agents ``--nnodes 1:2`` (1 worker each) train together; one is killed
with its workers (SIGKILL); time until the survivor trains again at the new size,
torchstep-agent defaults vs torchrun defaults (~40 s measured). Goal: under 5 s.

Both use the same c10d store hosted by a separate process (``is_host=false``, as the local
launcher does), so the measurement is the re-rendezvous, not the loss of the store.
Usage: ``python bench/agent_node_loss.py [--runs N]``. Writes its section of
bench/results/agent.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import (
    AGENT,
    SCRIPTS,
    TORCH_PYTHON,
    TORCHRUN,
    clean_env,
    figure_id,
    machine,
    median,
    row_command,
    update_section,
)
from figures import record
from figures import runs as mode_runs

TRAIN = str(SCRIPTS / "agent_train.py")
STORE = str(SCRIPTS / "agent_store.py")


def wait_for(cond, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    return None


def kill_all(procs: list[subprocess.Popen[bytes]], pids_dirs: list[Path]) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for d in pids_dirs:
        for f in d.iterdir() if d.exists() else []:
            try:
                os.kill(int(f.name), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for p in procs:
        p.wait()


def one_run(tool: str, endpoint: str, out: Path, i: int) -> float | None:
    marks = out / "marks"
    marks.mkdir(parents=True)
    base = [TORCHRUN] if tool == "torchrun" else [AGENT, "--log-dir", str(out / "logs")]
    args = [
        *base,
        "--nnodes",
        "1:2",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-conf",
        "is_host=false",
        "--rdzv-id",
        f"{tool}-{i}",
        TRAIN,
        "--dir",
        str(marks),
    ]
    procs, dirs = [], []
    for name in ("survivor", "victim"):
        d = out / f"pids-{name}"
        d.mkdir()
        dirs.append(d)
        procs.append(
            subprocess.Popen(
                args,
                env=clean_env(PIDS_DIR=str(d)),
                stdout=subprocess.DEVNULL,
                stderr=open(out / f"{name}.err", "w"),
                start_new_session=True,
            )
        )
    survivor, victim = procs

    def firsts() -> list[dict]:
        return [json.loads(p.read_text()) for p in marks.glob("first.*.json")]

    try:
        if not wait_for(lambda: len([f for f in firsts() if f["world"] == 2]) == 2, 120):
            return None
        t_kill = time.time()
        os.killpg(victim.pid, signal.SIGKILL)  # the node is gone: agent and workers
        for f in dirs[1].iterdir():
            os.kill(int(f.name), signal.SIGKILL)
        again = wait_for(lambda: [f for f in firsts() if f["world"] == 1], 150)
        if not again:
            return None
        survivor.wait(60)
        return again[0]["time"] - t_kill
    except subprocess.TimeoutExpired:
        return None
    finally:
        kill_all(procs, dirs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(2, 5))
    runs = ap.parse_args().runs
    times: dict[str, list[float]] = {"torchrun": [], "torchstep-agent": []}
    failed = {"torchrun": 0, "torchstep-agent": 0}
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        store = subprocess.Popen([TORCH_PYTHON, STORE, str(port_file)], env=clean_env(), start_new_session=True)
        try:
            port = wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60)
            endpoint = f"127.0.0.1:{port}"
            for i in range(runs):
                for tool in ["torchrun", "torchstep-agent"] if i % 2 == 0 else ["torchstep-agent", "torchrun"]:
                    t = one_run(tool, endpoint, Path(tmp) / f"{tool}-{i}", i)
                    print(f"{tool} run {i}: {'failed' if t is None else f'{t:.1f} s'}", flush=True)
                    if t is None:
                        failed[tool] += 1
                    else:
                        times[tool].append(t)
        finally:
            os.killpg(store.pid, signal.SIGKILL)
            store.wait()
    ours, theirs = median(times["torchstep-agent"]), median(times["torchrun"])
    rows = "\n".join(
        f"| {n} | {median(t):.1f} | {min(t, default=float('nan')):.1f} | {max(t, default=float('nan')):.1f} "
        f"| {failed[n]} of {runs} |"
        for n, t in times.items()
    )
    print(rows)
    record(
        figure_id("3"),
        "node loss under --nnodes 1:2: SIGKILL of a node -> survivor's next all-reduce",
        times["torchstep-agent"],
        times["torchrun"],
        peer_name="torchrun",
        goal=5.0,
        goal_on="ours",
        command=row_command(f"python bench/agent_node_loss.py --runs {runs}"),
        note=f"failed: torchstep {failed['torchstep-agent']}, torchrun {failed['torchrun']} of {runs}",
    )
    print(
        f"node loss: torchstep-agent {ours:.1f} s vs torchrun {theirs:.1f} s; ratio {ours / theirs:.2f} "
        f"(goal: under 5 s)"
    )
    update_section(
        figure_id("agent_node_loss"),
        f"""
## Node loss

`python bench/agent_node_loss.py --runs {runs}` — two agents `--nnodes 1:2`, one worker
each (`bench/scripts/agent_train.py`), c10d store in a separate process; one agent is
SIGKILLed with its worker; time until the survivor's first all-reduce at world size 1.
Defaults of each tool (torchstep: keep-alive tick 0.5 s, dead after 2 s, last call 1 s; torch: 5 s x 3, 30 s).

| command | median s | min s | max s | failed |
|---|---|---|---|---|
{rows}

- **node loss: torchstep-agent {ours:.1f} s vs torchrun {theirs:.1f} s** (goal: under 5 s;
  ratio {ours / theirs:.2f})

{machine()}
""",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
