"""Agent recovery: time from a worker's crash to the restarted group's first barrier,
torchstep-agent vs ``torchrun --max-restarts 1`` (2 workers, gloo), runs alternated; also
torchrun with torch's own fix for stale store data (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1).

torchrun shares the rendezvous store with the workers (pytorch#135712): a restarted
group may fail again or hang; such runs are counted, not timed. Usage:
``python bench/agent_recovery.py [--runs N]``. Writes its section of bench/results/agent.md.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
from agent_bench import AGENT, SCRIPTS, TORCH_ROW, TORCHRUN, clean_env, figure_id, machine, median, update_section
from figures import drop, record
from figures import runs as mode_runs

WORKER = str(SCRIPTS / "agent_recover.py")
#: A run that has not recovered by then hangs (a recovery takes a few seconds): counted, not timed.
HUNG_S = 30


def recovery(argv: list[str], out: Path, env: dict[str, str]) -> float | None:
    out.mkdir(parents=True)
    p = subprocess.Popen(
        [*argv, WORKER, str(out)],
        env=clean_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code = p.wait(HUNG_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)  # hung; workers have their own sessions: kill them by pid
        p.wait()
        for f in out.glob("pid.*"):
            try:
                os.kill(int(f.name.split(".")[1]), signal.SIGKILL)
            except ProcessLookupError:
                pass
        return None
    if code != 0 or not (out / "recovered").exists():
        return None
    return float((out / "recovered").read_text()) - float((out / "crash").read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=mode_runs(3, 9))
    runs = ap.parse_args().runs
    command = f"{f'BENCH_TORCH_ROW={TORCH_ROW} ' if TORCH_ROW else ''}python bench/agent_recovery.py --runs {runs}"
    fixed = "torchrun + TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    exec_ = "torchstep-agent --no-zygote"
    names = ["torchrun", fixed, "torchstep-agent", exec_]
    times: dict[str, list[float]] = {n: [] for n in names}
    failed = dict.fromkeys(names, 0)
    with tempfile.TemporaryDirectory() as tmp:
        plain = [TORCHRUN, "--nproc-per-node", "2", "--max-restarts", "1"]
        commands = {
            "torchrun": (plain, {}),
            fixed: (plain, {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}),
            "torchstep-agent": (
                [AGENT, "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", f"{tmp}/logs"],
                {},
            ),
            exec_: (
                [AGENT, "--no-zygote", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", f"{tmp}/logs"],
                {},
            ),
        }
        for i in range(runs):
            order = names if i % 2 == 0 else list(reversed(names))
            for name in order:
                argv, env = commands[name]
                t = recovery(argv, Path(tmp) / f"run{i}-{names.index(name)}", env)
                if t is None:
                    failed[name] += 1
                else:
                    times[name].append(t)
    # torchrun may recover in none of a quick run's few runs (pytorch#135712): then the peer is
    # torchrun with torch's own fix, named so, rather than no ratio at all
    peer_name = "torchrun" if times["torchrun"] else fixed
    peer = times[peer_name]
    peer_note = "" if times["torchrun"] else f" (plain torchrun recovered in 0 of {runs}: peer {fixed})"
    ratio = median(times["torchstep-agent"]) / median(peer)
    ratio_fixed = median(times["torchstep-agent"]) / median(times[fixed])
    rows = "\n".join(
        f"| {n} | {median(t):.2f} | {min(t, default=float('nan')):.2f} | {max(t, default=float('nan')):.2f} "
        f"| {failed[n]} of {runs} |"
        for n, t in times.items()
    )
    print(rows)
    print(f"recovery ratio torchstep-agent / {peer_name}: {ratio:.2f} (goal <= 0.25)")
    record(
        figure_id("2"),
        "recovery: crash -> restarted group's first barrier, --max-restarts 1 (the default: the worker zygote)",
        times["torchstep-agent"],
        peer,
        peer_name=peer_name,
        goal=0.25,
        command=command,
        note=f"failed to recover: torchstep {failed['torchstep-agent']}, torchrun {failed['torchrun']} of {runs}"
        + peer_note,
    )
    ratio_x = median(times[exec_]) / median(peer)
    print(f"recovery ratio torchstep-agent --no-zygote / {peer_name}: {ratio_x:.2f} (goal <= 0.5)")
    record(
        figure_id("2e"),
        "recovery with --no-zygote (every worker exec'd): crash -> restarted group's first barrier",
        times[exec_],
        peer,
        peer_name=peer_name,
        goal=0.5,
        command=command,
        note=f"failed to recover: torchstep --no-zygote {failed[exec_]}, torchrun {failed['torchrun']} of {runs}"
        + peer_note,
    )
    drop("2z")  # what figure 2 now measures (the zygote became the default)
    print(f"recovery ratio torchstep-agent / torchrun with the store fix: {ratio_fixed:.2f}")
    update_section(
        figure_id("agent_recovery"),
        f"""
## Recovery

`{command}` — 2 workers, `--max-restarts 1`, rank 1
crashes after the first barrier (`bench/scripts/agent_recover.py`); time from the crash
to the restarted group's first barrier. Failed = the restart did not recover (failed
again or hung > {HUNG_S} s).

| command | median s | min s | max s | failed |
|---|---|---|---|---|
{rows}

- **recovery ratio torchstep-agent / {peer_name}: {ratio:.2f}** (the default: the worker zygote;
  goal <= 0.25; the peer's median is over its runs that recovered{peer_note})
- recovery ratio torchstep-agent --no-zygote / {peer_name}: {ratio_x:.2f} (every worker exec'd)
- recovery ratio torchstep-agent / torchrun with `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`:
  {ratio_fixed:.2f} (there worker rank 0 hosts each new store and the others retry their
  connection until it is up; the agent hosts it)

{machine()}
""",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
