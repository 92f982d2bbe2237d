"""Surface ``kfp``: a KFP v2 pipeline whose one step is the soak AppDef made a component by
``torchstep_kfp.component_from_app``, run with ``kfp.local`` (SubprocessRunner) by a driver
in its own session (tools/soak/kfp_pipeline.py), one driver process per run.

The step is **1 replica x 4 processes** (the same world of 4 ranks as the other surfaces,
one agent): a multi-replica AppDef is a launcher step on KFP, whose Kubernetes Jobs need a
cluster (docs/kfp.md, "multi-node AppDefs (launcher step) need a cluster"), so kfp.local can
only run the one-container shape.

kfp.local runs the step as driver -> ``sh -ec <KFP's launch script>`` -> ``python -m
kfp.dsl.executor_main`` (the KFP executor, running ``torchstep_kfp.entry``) -> the agent.
The console is the driver's stdout (kfp.local copies the executor's output there); the
final state is kfp.local's (SUCCEEDED when the pipeline returned, FAILED when it raised
"finished with status FAILURE"); ``rc`` is the exit status of the KFP task process (kfp.local's
``Popen`` of the launch script: what KFP judges the task by); the result record is the step's
``result.json`` (``cfg log_dir``), and the task's ``result`` output parameter must agree with it.

How the external faults are injected:

- ``sigkill_watcher``: the process watching the step is the KFP executor (the agent's
  parent): SIGKILLed. The launch script's ``sh`` then exits 137, kfp.local reports the task
  FAILED; the agent sees its parent die and stops every process of the step (no result can be
  written by the dead executor: the agent's own replica result is there, the step's is not).
- ``cancel``: kfp.local has no cancel API; a user stops a local pipeline with **Ctrl-C**, which
  the terminal sends as SIGINT to the driver's whole process group (the driver, the launch
  script's ``sh`` and the executor: the agents run in their own sessions). The executor
  hears it (``stop_on_signals``): the step is CANCELLED (exit 143) within its grace period.
  kfp.local's pipeline call raises ``KeyboardInterrupt`` 0.25 s later and stops copying the
  step's output, so it reports no state (``state`` is the result's) and the console's tail
  is lost (each worker's console lines must be a prefix of its rank log's, :func:`check`).
  The faulty rank picks how (rank % 3): 0, Ctrl-C; 1, SIGTERM to the driver process alone
  (``kill <pid>``, a CI job's timeout): the driver dies at once, the executor notices within
  0.5 s that its ancestors died (``stop_when_ancestors_die``, a zombie counts as dead) and
  cancels the step the same way; 2, SIGINT to the driver alone, which lives on (a program
  that catches the interrupt; the driver waits for the task process, as ``Popen.__exit__``
  does after any other exception): kfp.local stops reading the step's output, the executor
  notices that its output pipe has no reader and cancels the step.
  Either way the executor must end within ``GRACE_S + CANCEL_MARGIN_S`` of the signal and
  nothing may be left running.
- ``sigkill_agent``: the agent (the executor's child) SIGKILLed: replaced from the budget.

In-worker faults (``exit``, ``nonretryable``, ``flood``) reach the workers through the
driver's environment (kfp.local's task process inherits it, and the step inherits its).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from tools.soak import faults, procs, runkit
from tools.soak.model import Observation, Run

NAME = "kfp"
FAULTS = ("none", "exit", "nonretryable", "sigkill_agent", "sigkill_watcher", "cancel", "flood")
LINES, INTERVAL_S = 10, 0.15
#: The step's shape under kfp.local (one container; see the module docstring).
REPLICAS, NPROC = 1, faults.WORLD
DRIVER = Path(__file__).resolve().parent.parent / "kfp_pipeline.py"
#: Seconds the driver has to start kfp.local's task process (imports kfp and torchstep_kfp).
START_S = 60.0
#: Exit status of KFP's launch script (``sh``) when the executor under it was SIGKILLed.
SH_KILLED = 128 + signal.SIGKILL

#: Where this surface's outcome differs from the local target's (faults.FAULTS).
EXPECT = {
    "sigkill_watcher": dataclasses.replace(
        faults.FAULTS["sigkill_watcher"][1],
        state="FAILED",
        exit_code=SH_KILLED,
        guarantee=(
            "the KFP executor running the step is SIGKILLed: its launch script exits 137, kfp.local reports "
            "the task FAILED; the agent sees its parent die and stops every process of the step; no result "
            "can be written by the dead executor"
        ),
    ),
    "cancel": dataclasses.replace(
        faults.FAULTS["cancel"][1],
        exit_code=None,  # kfp.local sees no exit status of the step: :func:`check` reads the result's
        guarantee=(
            "Ctrl-C (SIGINT to the driver's process group), SIGTERM to the driver alone, or SIGINT to a driver "
            "that lives on: "
            "kfp.local has no cancel and reports nothing, the executor cancels the step: result CANCELLED, "
            "exit 143, within grace_period + a margin, nothing left running"
        ),
    ),
}


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def executor_of(task: int) -> int:
    """The KFP executor process under kfp.local's task process ``task`` (``python -m
    kfp.dsl.executor_main``, the child of the launch script's ``sh``); 0 when not (yet) there.

    Args:
        task: the pid of the process kfp.local started.

    Returns:
        The executor's pid, or 0.
    """
    for pid in [task, *faults.descendants(task)]:
        argv = _cmdline(pid)
        if b"kfp.dsl.executor_main" in argv and not argv[0].endswith(b"sh"):
            return pid
    return 0


def _wait_for(pred: Any, timeout: float, alive: Any) -> Any:
    """``pred()`` once truthy, or None after ``timeout`` or when ``alive()`` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        if not alive():
            return pred() or None
        time.sleep(0.02)
    return None


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Run the soak pipeline once under kfp.local with ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, log_dir, tmp, root = (workdir / n for n in ("ckpt", "progress", "logs", "tmp", "kfp"))
    for d in (ckpt, progress, tmp, root):
        d.mkdir(mode=0o700)
    notes: list[str] = []
    token = uuid.uuid4().hex
    env = dict(
        os.environ,
        **runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S),
        TMPDIR=str(tmp),
        XDG_STATE_HOME=str(workdir / "state"),
    )
    record_file, pid_file = workdir / "driver.json", workdir / "task.pid"
    argv = [
        sys.executable,
        str(DRIVER),
        "--out",
        str(record_file),
        "--pid-file",
        str(pid_file),
        "--root",
        str(root),
        "--log-dir",
        str(log_dir),
        "--replicas",
        str(REPLICAS),
        "--nproc",
        str(NPROC),
        "--timeout",
        str(faults.timeout_of(run.fault)),
        "--grace",
        f"{faults.GRACE_S:g}",
    ]
    console = workdir / "console.txt"
    started = time.monotonic()
    deadline = started + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S + START_S
    hung, injected, executor = False, True, 0
    extra: dict[str, Any] = {}
    with open(console, "wb") as out:
        driver = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=workdir, start_new_session=True
        )
        alive = lambda: driver.poll() is None  # noqa: E731
        task = _wait_for(lambda: pid_file.exists() and int(pid_file.read_text()), START_S, alive) or 0
        executor = _wait_for(lambda: executor_of(task), START_S, alive) if task else 0
        extra["executor"] = executor
        if not faults.FAULTS[run.fault][0] and run.fault != "none":
            if not executor:
                injected = False
                faults.release(progress)
                notes.append("the KFP executor process was never seen: fault not injected")
            else:
                injected = faults.inject_external(
                    run.fault,
                    run.rank,
                    run.moment,
                    alive=lambda: _alive(executor),
                    watcher=executor,
                    progress=progress,
                    log_dir=log_dir,
                    cancel=lambda: _cancel(driver.pid, run.rank, notes),
                )
            if run.fault == "cancel" and injected:
                sent = time.monotonic()
                ended = _wait_for(lambda: not _alive(executor), faults.GRACE_S + faults.CANCEL_MARGIN_S, lambda: True)
                extra["cancel_s"] = time.monotonic() - sent
                if ended:
                    notes.append(f"cancel: the KFP executor ended {extra['cancel_s']:.1f} s after the signal")
                else:
                    hung = True
                    notes.append(
                        f"cancel: the KFP executor still ran "
                        f"{faults.GRACE_S + faults.CANCEL_MARGIN_S:g} s after the signal"
                    )
        if not hung:
            try:
                driver.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
                notes.append("the kfp.local driver was still running at the deadline")
        if hung:
            try:
                os.killpg(driver.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        driver.wait()
    duration = time.monotonic() - started
    record: dict[str, Any] = {}
    try:
        record = json.loads(record_file.read_text())
    except FileNotFoundError:
        notes.append(f"the driver wrote no record (exit {driver.returncode})")
    except (OSError, ValueError) as e:
        notes.append(f"the driver's record is unreadable: {e}")
    extra.update(driver_rc=driver.returncode, record=record)
    run_dir = next((p for p in sorted(log_dir.glob("soak-*")) if p.is_dir()), None) if log_dir.exists() else None
    result, source = None, "none"
    if run_dir and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    task_rc = record.get("task_rc")
    rc = int(task_rc) if isinstance(task_rc, int) else -1
    if run.fault == "cancel" and injected:
        # kfp.local sees no exit status of the step: Ctrl-C killed the launch script's sh (-2),
        # or the driver died first; the executor's own status (reparented) reaches no one
        extra["task_rc"] = task_rc
        rc = int((result or {}).get("exit_code", -1))
    stopped = run.fault in ("sigkill_watcher", "cancel") and injected
    return Observation(
        rc=rc,
        duration_s=duration,
        result=result,
        result_source=source,
        console=console.read_text(errors="replace"),
        run_dir=run_dir,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        state=record.get("state"),
        watcher_killed=stopped,
        agent_killed=run.fault == "sigkill_agent" and injected,
        extra=extra,
    )


def _cancel(driver: int, rank: int, notes: list[str]) -> None:
    """Stop the pipeline as a user does, by ``rank % 3``: Ctrl-C (SIGINT to the driver's
    process group), SIGTERM to the driver alone, SIGINT to the driver alone (it lives on)."""
    how = rank % 3
    if how == 0:
        notes.append("cancel: Ctrl-C (SIGINT to the driver's process group)")
        os.killpg(driver, signal.SIGINT)
    elif how == 1:
        notes.append("cancel: SIGTERM to the kfp.local driver alone")
        os.kill(driver, signal.SIGTERM)
    else:
        notes.append("cancel: SIGINT to the kfp.local driver alone (it lives on; kfp.local stops reading)")
        os.kill(driver, signal.SIGINT)


def _same(a: Any, b: Any) -> bool:
    """Equal as a KFP parameter carries it: numbers as doubles (a Struct's: ``0.0`` for
    ``0``), keys with a null value left out."""
    if isinstance(a, dict) and isinstance(b, dict):
        a, b = ({k: v for k, v in d.items() if v is not None} for d in (a, b))
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        return float(a) == float(b)
    return bool(a == b)


def check(run: Run, obs: Observation) -> list[tuple[str, str]]:
    """This surface's own checks (invariants 3, 5 and 6 as KFP shows them).

    - the task's ``result`` output parameter, when kfp.local returned it, is the step's
      ``result.json`` (KFP's doubles aside; nulls are left out of a KFP parameter);
    - kfp.local's state agrees with the task's exit status (SUCCEEDED exactly when 0);
    - the compiled task has no KFP retry (``set_retry``): the soak's REPLICA budget is the
      agent's, a KFP retry on top would be a second retry layer;
    - a cancel ends the executor within the grace period + margin (the wait above), and
      each worker's console lines are a prefix of its rank log's (kfp.local stops copying
      the step's output on Ctrl-C: the tail is lost, never reordered nor repeated).

    Args:
        run: the planned run.
        obs: what :func:`run` observed.

    Returns:
        ``(invariant key, detail)`` for each thing that does not hold.
    """
    from tools.soak.invariants import numbered

    bad: list[tuple[str, str]] = []
    record = obs.extra.get("record") or {}
    output = record.get("result")
    if output is not None and obs.result is not None:
        if not _same(output, obs.result):
            diff = sorted(k for k in set(output) | set(obs.result) if not _same(output.get(k), obs.result.get(k)))
            bad.append(("6", f"the task's result output differs from result.json in {diff}"))
    if record and record.get("kfp_retries") != 0:
        bad.append(
            (
                "4",
                f"the compiled task retries {record.get('kfp_retries')} time(s) on KFP: a second retry "
                "layer over the agent's REPLICA budget",
            )
        )
    if obs.state is not None and (obs.state == "SUCCEEDED") != (obs.rc == 0):
        bad.append(("6", f"kfp.local says {obs.state} but the task process exited {obs.rc}"))
    if run.fault == "cancel" and obs.injected and (obs.result or {}).get("exit_code") != 128 + signal.SIGTERM:
        bad.append(("1", f"cancelled: the result's exit code is {(obs.result or {}).get('exit_code')}, expected 143"))
    if run.fault == "cancel" and obs.injected and obs.run_dir is not None:
        console = numbered(obs.console)
        for log in sorted(obs.run_dir.glob("*/*/attempt_*/rank*.log")):
            for pid, items in numbered(log.read_text(errors="replace")).items():
                shown = console.get(pid, [])
                if shown != items[: len(shown)]:
                    bad.append(
                        ("3", f"console lines of pid {pid} are not a prefix of its rank log's: {shown} vs {items}")
                    )
    return bad
