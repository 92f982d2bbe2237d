"""Restarts within the budget: they must be reliable, not lucky.

With torch's defaults a restarted gloo group can read the previous attempt's data from
the shared rendezvous store and fail again or hang (pytorch#135712: 4 of 6 crash-once
runs here); the agent gives every group start a fresh store. The crash-once scenario
runs 10 times, and so do the expired-timer and missing-heartbeat scenarios (node loss:
test_agent_multinode.py): zero extra restarts, zero hangs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from agent_testlib import WORKER, Agents

RUNS = 10


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_once_recovers_with_exactly_one_restart_10_times(agents: Agents) -> None:
    def one(i: int) -> str | None:
        a = agents.run(
            ["--nproc-per-node", "2", "--max-restarts", "1", WORKER, "--mode", "crash-once"], timeout=90, name=f"run{i}"
        )
        r = a.result if a.result_file.exists() else {}
        attempts = sorted(p.name for p in a.log_dir.glob("*_*/attempt_*"))
        if a.returncode != 0 or (r.get("state"), r.get("restarts")) != ("SUCCEEDED", 1) or len(attempts) != 2:
            return f"run {i}: exit {a.returncode}, {attempts}\n{a.diagnostics()}"
        if "attempt 0: rank 1 worker_failed (exit 3)" not in r["replicas"][0]["message"]:
            return f"run {i}: {r['replicas'][0]['message']}"
        return None

    # two streams of five runs each: the same 10 restarts, half the wall time on 2 cores
    # (the extra load makes a store race, if any, more likely, not less)
    repeat(one)


def repeat(one, runs: int = RUNS) -> None:
    """Run ``one(i)`` ``runs`` times in two streams; every problem it returns fails the test."""
    with ThreadPoolExecutor(2) as pool:
        problems = [p for p in pool.map(one, range(runs)) if p]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_expired_timer_kills_only_the_stuck_worker_and_the_group_restarts_10_times(agents: Agents) -> None:
    def one(i: int) -> str | None:
        api = ("torch", "torchstep")[i % 2]  # torch's own timer.expires() and torchstep.expires()
        a = agents.run(
            ["--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "2", WORKER, "--mode", f"timer-{api}"],
            timeout=90,
            name=f"timer{i}",
        )
        # the stock FileTimerServer would have killed the agent too (exit 137, pytorch#141060)
        r = a.result if a.result_file.exists() else {}
        if a.returncode != 0 or (r.get("state"), r.get("restarts")) != ("SUCCEEDED", 1):
            return f"run {i} ({api}): exit {a.returncode}\n{a.diagnostics()}"
        expected = "attempt 0: rank 1 timer_expired (SIGKILL): timer 'stuck-step' expired"
        if expected not in r["replicas"][0]["message"]:
            return f"run {i} ({api}): {r['replicas'][0]['message']}"
        first = list(a.log_dir.glob("*_*/attempt_0/1/stdout.log"))
        if not first or "start rank=1 restart=0" not in first[0].read_text():
            return f"run {i} ({api}): rank 1's first attempt log is missing its start line"
        return None

    repeat(one)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_missing_heartbeat_kills_and_restarts_then_names_the_rank_10_times(agents: Agents) -> None:
    def one(i: int) -> str | None:
        a = agents.run(
            [
                "--nproc-per-node",
                "2",
                "--max-restarts",
                "1",
                "--heartbeat-timeout",
                "2",
                "--stop-timeout",
                "2",
                WORKER,
                "--mode",
                "heartbeat",
            ],
            timeout=90,
            name=f"hb{i}",
        )
        r = a.result if a.result_file.exists() else {}
        # killed, restarted once, killed again: the budget is spent and the rank is named
        if a.returncode != 137 or (r.get("state"), r.get("restarts")) != ("FAILED", 1):
            return f"run {i}: exit {a.returncode}\n{a.diagnostics()}"
        root = r["root_cause"]
        if (root["rank"], root["reason"], root["signal"]) != (1, "heartbeat_timeout", "SIGKILL"):
            return f"run {i}: root cause {root}"
        if "no torchstep.heartbeat() for" not in root["message"]:
            return f"run {i}: {root['message']}"
        if "attempt 0: rank 1 heartbeat_timeout" not in r["replicas"][0]["message"]:
            return f"run {i}: {r['replicas'][0]['message']}"
        ranks = {k["rank"]: k for k in r["replicas"][0]["ranks"]}
        if ranks[0]["reason"] != "stopped":  # rank 0 heart-beat; the agent stopped it afterwards
            return f"run {i}: rank 0 {ranks[0]}"
        return None

    repeat(one)
