"""Signals to the agent: forwarded, grace period, SIGKILL of whole process groups, exit
128+signal, state CANCELLED, a result file — and nothing left behind (checked in /proc)."""

from __future__ import annotations

import os
import signal
import time

import pytest
from agent_testlib import WORKER, Agent, Agents, alive
from proclib import wait_for


def _start_lingering(agents: Agents, tmp_path, mode: str, grace: float) -> tuple[Agent, list[int]]:
    ready = tmp_path / "ready"
    ready.mkdir()
    a = agents.start(
        ["--nproc-per-node", "2", "--grace-period", str(grace), WORKER, "--mode", mode, "--dir", str(ready)]
    )
    wait_for(lambda: len(list(ready.iterdir())) == 2, 60, "both workers ready")
    pids = a.worker_pids()
    assert len(pids) == 4  # two workers and their grandchildren
    assert all(alive(p) for p in pids)
    return a, pids


def test_sigterm_forwards_then_kills_process_groups_after_grace(agents: Agents, tmp_path) -> None:
    grace = 3.0
    a, pids = _start_lingering(agents, tmp_path, "linger", grace)  # everything ignores SIGTERM
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGTERM)
    wait_for(lambda: not any(alive(p) for p in pids), grace + 2, "workers and grandchildren gone")
    elapsed = time.monotonic() - t0
    assert elapsed >= grace - 0.5  # they were given the grace period
    assert a.wait(30) == 143
    r = a.result
    assert r["state"] == "CANCELLED" and r["exit_code"] == 143 and "SIGTERM" in r["message"]
    assert {k["state"] for k in r["replicas"][0]["ranks"]} == {"CANCELLED"}


def test_sigusr1_is_forwarded_and_reported(agents: Agents, tmp_path) -> None:
    a, pids = _start_lingering(agents, tmp_path, "grandchild", 30)
    os.kill(a.pid, signal.SIGUSR1)
    # the workers die of SIGUSR1 at once: no need to wait for the 30 s grace period
    wait_for(lambda: not any(alive(p) for p in pids), 10, "workers and grandchildren gone")
    assert a.wait(30) == 128 + signal.SIGUSR1
    r = a.result
    assert r["state"] == "CANCELLED" and r["exit_code"] == 138
    assert {k["signal"] for k in r["replicas"][0]["ranks"]} == {"SIGUSR1"}


def test_second_signal_kills_at_once(agents: Agents, tmp_path) -> None:
    a, pids = _start_lingering(agents, tmp_path, "linger", 60)
    os.kill(a.pid, signal.SIGTERM)
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(a.pid, signal.SIGINT)
    wait_for(lambda: not any(alive(p) for p in pids), 5, "workers and grandchildren gone")
    assert time.monotonic() - t0 < 5
    assert a.wait(30) == 143


def test_sigkill_of_the_agent_takes_workers_and_grandchildren_along(agents: Agents, tmp_path) -> None:
    a, pids = _start_lingering(agents, tmp_path, "linger", 30)
    os.kill(a.pid, signal.SIGKILL)  # the agent alone, not its group
    t0 = time.monotonic()
    wait_for(lambda: not any(alive(p) for p in pids), 2, "workers and grandchildren gone within 2 s")
    assert time.monotonic() - t0 <= 2
    a.wait(10)
    r = wait_for(lambda: a.result if a.result["state"] != "RUNNING" else None, 5, "the reaper's result")
    assert r["state"] == "FAILED" and r["exit_code"] == 137 and "agent died" in r["message"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_before_workers_start_still_writes_a_result(agents: Agents, sig: int) -> None:
    # two nodes expected, only one comes: the agent waits in the rendezvous
    a = agents.start(["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:0", WORKER, "--mode", "exit"])
    wait_for(lambda: "attempts to join" in a.stderr or "effective settings" in a.stderr, 60, "agent started")
    time.sleep(0.5)
    os.kill(a.pid, sig)
    assert a.wait(30) == 128 + sig
    r = a.result
    assert r["state"] == "CANCELLED" and r["exit_code"] == 128 + sig


# Runs the agent with one of its phases wrapped in code that swallows every exception, as
# torch's import did with the early handler's (a C extension's import turned it into a
# TypeError or dropped it): the signal arrives once (a parent's PR_SET_PDEATHSIG) and must
# still end the run, not be lost while the workers run on.
_SWALLOWING_AGENT = """\
import os, signal, sys
from torchstep.agent import cli, elastic, settings

phase = sys.argv.pop(1)
if phase == "import":  # before the workers exist: the early handler's Cancelled is lost
    original_resolve = settings.resolve

    def resolve(args):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except BaseException:
            pass
        return original_resolve(args)

    settings.resolve = resolve
else:  # during the rendezvous: torch's SignalException is lost
    original_rendezvous = elastic.TorchstepAgent._rendezvous

    def _rendezvous(self, worker_group):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
        except Exception:
            pass
        original_rendezvous(self, worker_group)

    elastic.TorchstepAgent._rendezvous = _rendezvous
cli.main()
"""


@pytest.mark.parametrize("phase", ["import", "rendezvous"])
def test_a_signal_whose_exception_a_library_swallowed_still_cancels_the_run(agents: Agents, phase: str) -> None:
    import sys

    a = agents.start_command(
        [
            sys.executable,
            "-c",
            _SWALLOWING_AGENT,
            phase,
            "--nproc-per-node",
            "1",
            WORKER,
            "--mode",
            "linger",
            "--dir",
            str(agents.tmp_path),
        ],
        name=f"swallow-{phase}",
    )
    code = a.wait(60)  # before the fix: the workers ran on until killed
    assert code == 143, a.diagnostics()
    r = a.result
    assert r["state"] == "CANCELLED" and "SIGTERM" in r["message"], r
    assert not any(alive(p) for p in a.worker_pids())
