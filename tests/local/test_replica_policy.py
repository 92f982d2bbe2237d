"""REPLICA policy on the local target: a lost replica (its agent SIGKILLed) is replaced and
re-admitted by the rendezvous while the role's budget lasts; then the run fails with the
loss as its root cause. Real agents, real gloo workers."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torchstep
from local_testlib import rank_log_has, role
from proclib import wait_for
from torchstep.local import ReplicaEvent
from torchstep.steps import run_local
from torchx import specs


class Run:
    """run_local in a thread, with its events."""

    def __init__(self, app: specs.AppDef, log_dir: Path) -> None:
        self.events: list[ReplicaEvent] = []
        self.result: torchstep.StepResult | None = None
        self.log_dir = log_dir
        self.thread = threading.Thread(target=self._run, args=(app,))
        self.thread.start()

    def _run(self, app: specs.AppDef) -> None:
        self.result = run_local(app, log_dir=str(self.log_dir), on_status=self.events.append, cfg={"grace_period": 5})

    def running(self, role: str, replica: int, incarnation: int) -> ReplicaEvent | None:
        return next(
            (
                e
                for e in self.events
                if (e.role, e.replica_id, e.state, e.incarnation) == (role, replica, "RUNNING", incarnation)
            ),
            None,
        )

    def kill_when_training(self, replica: int, incarnation: int) -> int:
        """SIGKILL the agent of trainer replica <replica> once its workers have taken a few steps."""
        ev = wait_for(lambda: self.running("trainer", replica, incarnation), 120, f"agent #{incarnation} to start")
        wait_for(
            lambda: rank_log_has(self.log_dir, "trainer", replica, "step 3", newer_than=ev.ts),
            180,
            f"trainer/{replica} #{incarnation} to train",
        )
        assert ev.pid is not None
        os.kill(ev.pid, signal.SIGKILL)
        return ev.pid

    def join(self) -> torchstep.StepResult:
        self.thread.join(300)
        assert not self.thread.is_alive() and self.result is not None
        return self.result


def trainer(max_retries: int) -> specs.AppDef:
    return specs.AppDef(
        "lost",
        roles=[
            role(
                "trainer",
                ["loop", "40", "0.1"],
                replicas=2,
                max_retries=max_retries,
                retry_policy=specs.RetryPolicy.REPLICA,
            )
        ],
    )


@pytest.mark.slow
def test_lost_replica_is_replaced_and_the_job_finishes(log_dir: Path) -> None:
    run = Run(trainer(max_retries=2), log_dir)
    run.kill_when_training(replica=1, incarnation=0)
    result = run.join()

    assert result.state == "SUCCEEDED", result.to_json()
    lost = [e for e in run.events if e.state == "FAILED"]
    assert [(e.replica_id, e.exit_code, e.incarnation) for e in lost] == [(1, 128 + signal.SIGKILL, 0)]
    assert "replacing it (1/2" in (lost[0].message or "")
    assert run.running("trainer", 1, 1) is not None  # the replacement agent
    replica1 = next(r for r in result.replicas if r.replica_id == 1)
    assert replica1.restarts >= 1 and result.restarts >= 1  # the replacement is counted
    assert len(result.ranks) == 2 and all(r.state == "SUCCEEDED" for r in result.ranks)


@pytest.mark.slow
def test_budget_exhausted_fails_with_the_loss_as_root_cause(log_dir: Path) -> None:
    run = Run(trainer(max_retries=1), log_dir)
    run.kill_when_training(replica=1, incarnation=0)  # replaced: the budget (1) is spent
    time.sleep(0.5)
    second = run.kill_when_training(replica=1, incarnation=1)
    result = run.join()

    assert result.state == "FAILED" and result.retryable, result.to_json()
    rc = result.root_cause
    assert rc is not None and (rc.role, rc.replica_id, rc.signal, rc.reason) == (
        "trainer",
        1,
        "SIGKILL",
        "replica_lost",
    )
    assert f"(pid {second})" in (rc.message or "") and "budget is spent" in (rc.message or "")
    assert result.exit_code == 128 + signal.SIGKILL
    assert [e.incarnation for e in run.events if e.state == "FAILED" and e.replica_id == 1] == [0, 1]
