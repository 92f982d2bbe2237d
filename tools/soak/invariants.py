"""The invariants of issue 27, checked after every run: 1-6 here, for every surface; a
surface's own (7, the kubernetes target's) in its module's ``check``."""

from __future__ import annotations

import itertools
import re
import stat
from collections import defaultdict
from pathlib import Path

from tools.soak import faults
from tools.soak.model import Observation, Run, Violation

LINE = re.compile(r"soak rank=(\d+) attempt=(\d+) pid=(\d+) line=(\d+)$")
#: names of the invariants, as the report prints them
NAMES = {
    "1": "1 final state",
    "2": "2 no process left",
    "3": "3 no line lost or duplicated",
    "4": "4 retries as planned",
    "5": "5 deadline",
    "6": "6 result record, private files",
    "7": "7 kubernetes: one gang, nothing left",
}


def numbered(text: str) -> dict[int, list[tuple[int, int]]]:
    """Per worker pid, its ``(rank, line)`` in the order printed (console prefixes ignored)."""
    seq: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for raw in text.splitlines():
        m = LINE.search(raw)
        if m:
            seq[int(m[3])].append((int(m[1]), int(m[4])))
    return seq


def _consecutive(where: str, seq: dict[int, list[tuple[int, int]]]) -> list[str]:
    bad = []
    for pid, items in seq.items():
        lines = [n for _, n in items]
        if any(b != a + 1 for a, b in itertools.pairwise(lines)):
            bad.append(f"{where}: pid {pid} printed lines {lines} (a gap or a duplicate)")
    return bad


def _covered(where: str, seq: dict[int, list[tuple[int, int]]], lines: int) -> list[str]:
    per_rank: dict[int, set[int]] = defaultdict(set)
    for items in seq.values():
        for rank, n in items:
            per_rank[rank].add(n)
    bad = []
    for rank in range(faults.WORLD):
        missing = sorted(set(range(lines)) - per_rank[rank])
        if missing:
            bad.append(f"{where}: rank {rank} never printed lines {missing}")
    return bad


def check_lines(obs: Observation, lines: int, complete: bool) -> list[str]:
    """Invariant 3: in every rank log and in the console, each worker's numbered lines are
    consecutive (none lost or repeated); a complete run covers every line on every rank; the
    console holds exactly the rank logs' lines of each worker, in order.

    Args:
        obs: the observation.
        lines: how many lines each rank prints in a complete run.
        complete: the run SUCCEEDED (every line must be there).

    Returns:
        What does not hold.
    """
    bad: list[str] = []
    console = numbered(obs.console)
    bad += _consecutive("console", console)
    files: dict[int, list[tuple[int, int]]] = defaultdict(list)
    if obs.run_dir is not None and obs.expect_lines_in_files:
        for log in sorted(obs.run_dir.glob("*/*/attempt_*/rank*.log")):
            one = numbered(log.read_text(errors="replace"))
            bad += _consecutive(str(log.relative_to(obs.run_dir)), one)
            for pid, items in one.items():
                files[pid] += items
    if complete:
        bad += _covered("console", console, lines)
        if obs.run_dir is not None and obs.expect_lines_in_files:
            bad += _covered("rank logs", files, lines)
    if files and not obs.watcher_killed:  # a SIGKILLed watcher stops printing at once
        for pid, items in files.items():
            shown = console.get(pid, [])
            # a SIGKILLed agent takes what its tee had not yet copied to the console along:
            # its workers' console lines may stop short, but in order and never repeated
            cut_short = obs.agent_killed and shown == items[: len(shown)]
            if shown != items and not cut_short:
                bad.append(f"console and rank log of pid {pid} differ: {shown} vs {items}")
    return bad


def check_private(run_dir: Path | None) -> list[str]:
    """Invariant 6 (files): everything under the run directory is 0700 / 0600 or stricter."""
    bad: list[str] = []
    if run_dir is None:
        return bad
    for path in [run_dir, *run_dir.rglob("*")]:
        try:
            st = path.lstat()
        except OSError:
            continue
        if path.name == ".filler":
            continue
        if stat.S_IMODE(st.st_mode) & 0o077:
            bad.append(f"{path} is {oct(stat.S_IMODE(st.st_mode))}")
    return bad


def check(run: Run, obs: Observation, lines: int, expect: faults.Expect | None = None) -> list[Violation]:
    """Every invariant of one run.

    Args:
        run: the planned run.
        obs: what the surface observed.
        lines: lines per rank of a complete run.
        expect: the surface's expected outcome (default: the local target's, faults.FAULTS).

    Returns:
        The violations (empty: the run held).
    """
    fault = run.fault if obs.injected else "none"
    exp = expect if expect is not None and obs.injected else faults.FAULTS[fault][1]
    out: list[Violation] = []

    def v(inv: str, detail: str) -> None:
        out.append(Violation(run, NAMES[inv], detail))

    res = obs.result
    state = obs.state if obs.state is not None else (res or {}).get("state")
    # 5: never a hang
    if obs.hung:
        v("5", f"killed at the deadline after {obs.duration_s:.0f} s ({'; '.join(obs.notes)})")
    # 1: the final state of this class, the root cause naming the rank
    if exp.exit_code is not None and obs.rc != exp.exit_code:
        v("1", f"exit status {obs.rc}, expected {exp.exit_code}")
    if exp.state is not None and state != exp.state:
        v("1", f"state {state}, expected {exp.state} (message: {(res or {}).get('message')})")
    if exp.record and res is None:
        v("6", f"no result record ({obs.result_source})")
    elif exp.record and res is not None:
        cause = res.get("root_cause") or {}
        if exp.names_rank and cause.get("rank") != run.rank:
            v("1", f"root cause names rank {cause.get('rank')}, the faulty rank is {run.rank}")
        # 4: restarts and tries exactly as planned, never a retry of a non-retryable error
        again = (
            sorted(str(p.relative_to(obs.run_dir)) for p in obs.run_dir.glob("*/*/attempt_1")) if obs.run_dir else []
        )
        if exp.restarts is None and again:
            v("4", f"a worker group was started again: {again}")
        twice = (
            sorted(str(p.relative_to(obs.run_dir)) for p in obs.run_dir.glob("*/*/attempt_2")) if obs.run_dir else []
        )
        if twice:
            v("4", f"a worker group restarted twice for one fault: {twice}")
        if not exp.restarts_ok(res.get("restarts")) or res.get("attempts") != exp.attempts:
            v(
                "4",
                f"restarts {res.get('restarts')} attempts {res.get('attempts')}, expected "
                f"{exp.restarts_text} / {exp.attempts}",
            )
        if fault == "nonretryable" and res.get("retryable") is not False:
            v("4", f"a non-retryable error reported retryable={res.get('retryable')}")
        # 6: the record agrees with the exit status and the orchestrator's state
        if res.get("exit_code") != obs.rc or res.get("state") != state:
            v("6", f"result says {res.get('state')} exit {res.get('exit_code')}; observed {state}, exit {obs.rc}")
        running = [
            (r.get("replica_id"), k.get("rank"))
            for r in res.get("replicas") or []
            for k in r.get("ranks") or []
            if k.get("state") == "RUNNING"
        ]
        if running:
            v("6", f"the final result shows (replica, rank) {running} still RUNNING")
        if exp.message_has and exp.message_has not in str(res.get("message")):
            v("1", f"the message does not say {exp.message_has!r}: {res.get('message')!r}")
        if fault == "logfull" and not res.get("warnings"):
            v("1", "the log disk filled but the result has no warning")
    # 2: nothing left
    if obs.leftovers:
        v("2", "alive 15 s after the end: " + " | ".join(obs.leftovers))
    # 3: lines
    complete = state == "SUCCEEDED" and exp.state == "SUCCEEDED"
    for detail in check_lines(obs, lines, complete):
        v("3", detail)
    # 6: private files
    for detail in check_private(obs.run_dir)[:5]:
        v("6", f"not private: {detail}")
    return out
