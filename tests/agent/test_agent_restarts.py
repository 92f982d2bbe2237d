"""Restarts within the budget: they must be reliable, not lucky.

With torch's defaults a restarted gloo group can read the previous attempt's data from
the shared rendezvous store and fail again or hang (pytorch#135712); the agent sets
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1. Each scenario runs 10 times in a row: zero extra
restarts, zero hangs.
"""

from __future__ import annotations

import pytest
from agent_testlib import WORKER, Agents

RUNS = 10


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_crash_once_recovers_with_exactly_one_restart_10_times(agents: Agents) -> None:
    for i in range(RUNS):
        a = agents.run(
            ["--nproc-per-node", "2", "--max-restarts", "1", WORKER, "--mode", "crash-once"], timeout=60, name=f"run{i}"
        )
        assert a.returncode == 0, f"run {i}:\n{a.diagnostics()}"
        r = a.result
        assert (r["state"], r["restarts"]) == ("SUCCEEDED", 1), f"run {i}"
        assert sorted(p.name for p in a.log_dir.glob("attempt_*")) == ["attempt_0", "attempt_1"], f"run {i}"
        assert "attempt 0: rank 1 worker_failed (exit 3)" in r["replicas"][0]["message"]


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
