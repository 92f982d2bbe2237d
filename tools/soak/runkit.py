"""What every surface's ``run`` does alike: the job's environment and the verdict on whether
the fault was injected."""

from __future__ import annotations

from pathlib import Path

from tools.soak import faults
from tools.soak.model import Run


def job_env(run: Run, token: str, ckpt: Path, progress: Path, lines: int, interval_s: float) -> dict[str, str]:
    """The soak job's environment for ``run``: its marker, checkpoint and progress directories,
    its length and pace, and the fault's own variables (faults.in_worker_env, faults.hold_env,
    faults.tail_env).

    Args:
        run: the planned run.
        token: the run's marker (``SOAK_MARK``: the leftover scan looks for it).
        ckpt: the checkpoint directory.
        progress: the directory the ranks report their lines in.
        lines: lines per rank.
        interval_s: the pause after each line.

    Returns:
        The variables, to merge into the environment the surface gives the job.
    """
    return {
        "SOAK_MARK": token,
        "SOAK_CKPT": str(ckpt),
        "SOAK_PROGRESS": str(progress),
        "SOAK_LINES": str(lines),
        "SOAK_INTERVAL": str(interval_s),
        "PYTHONUNBUFFERED": "1",
        **faults.in_worker_env(run.fault, run.rank, run.moment),
        **faults.hold_env(run.fault, run.rank, run.moment),
        **faults.tail_env(run.fault),
    }


def settle_injected(run: Run, ckpt: Path, injected: bool, notes: list[str]) -> bool:
    """Whether ``run``'s fault was really injected: an in-worker fault leaves its marker in the
    checkpoint directory when it fires; an external one is what the surface saw. A fault that
    never struck (the run ended first) is noted: the run is then judged as a fault-free one.

    Args:
        run: the planned run.
        ckpt: the checkpoint directory.
        injected: what the surface saw of an external fault.
        notes: the run's report notes.

    Returns:
        Whether the fault struck.
    """
    if faults.FAULTS.get(run.fault, (False,))[0]:
        injected = (ckpt / f".fault-{run.fault}").exists()
    if not injected and run.fault != "none":
        notes.append(f"the run ended before rank {run.rank} reached line {run.moment}: fault not injected")
    return injected
