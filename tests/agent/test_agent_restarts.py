"""Restarts within the budget: they must be reliable, not lucky.

With torch's defaults a restarted gloo group can read the previous attempt's data from
the shared rendezvous store and fail again or hang (pytorch#135712: 4 of 6 crash-once
runs here); the agent gives every group start a fresh store. The crash-once scenario
runs 10 times (node loss: test_agent_multinode.py): zero extra restarts, zero hangs.
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
        attempts = sorted(p.name for p in a.log_dir.glob("attempt_*"))
        if a.returncode != 0 or (r.get("state"), r.get("restarts")) != ("SUCCEEDED", 1) or len(attempts) != 2:
            return f"run {i}: exit {a.returncode}, {attempts}\n{a.diagnostics()}"
        if "attempt 0: rank 1 worker_failed (exit 3)" not in r["replicas"][0]["message"]:
            return f"run {i}: {r['replicas'][0]['message']}"
        return None

    # two streams of five runs each: the same 10 restarts, half the wall time on 2 cores
    # (the extra load makes a store race, if any, more likely, not less)
    with ThreadPoolExecutor(2) as pool:
        problems = [p for p in pool.map(one, range(RUNS)) if p]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("api", ["torch", "torchstep"])
def test_expired_timer_kills_only_the_stuck_worker_and_the_group_restarts(agents: Agents, api: str) -> None:
    a = agents.run(
        ["--nproc-per-node", "2", "--max-restarts", "1", "--stop-timeout", "2", WORKER, "--mode", f"timer-{api}"],
        timeout=90,
    )
    # the stock FileTimerServer would have killed the agent too (exit 137, pytorch#141060)
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1)
    assert "attempt 0: rank 1 timer_expired (SIGKILL): timer 'stuck-step' expired" in r["replicas"][0]["message"]
    first = (a.log_dir / "attempt_0" / "rank1.log").read_text()
    assert "start rank=1 restart=0" in first


def test_missing_heartbeat_kills_and_restarts_then_names_the_rank(agents: Agents) -> None:
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
    )
    assert a.returncode == 137, a.diagnostics()
    r = a.result
    assert (r["state"], r["restarts"]) == ("FAILED", 1)  # killed, restarted, killed again
    root = r["root_cause"]
    assert (root["rank"], root["reason"], root["signal"]) == (1, "heartbeat_timeout", "SIGKILL")
    assert "no torchstep.heartbeat() for" in root["message"]
    assert "attempt 0: rank 1 heartbeat_timeout" in r["replicas"][0]["message"]
    ranks = {k["rank"]: k for k in r["replicas"][0]["ranks"]}
    assert ranks[0]["reason"] == "stopped"  # rank 0 heart-beat; the agent stopped it afterwards
