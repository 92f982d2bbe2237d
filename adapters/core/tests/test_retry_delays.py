"""One rule for the step's retry waits (StepRetry.delays): a two-role app whose roles set
different delays is retried after the same waits by `torchstep run`, in the Airflow task
arguments and in the explain table. (The local launcher's real waits are measured in
tests/local.)"""

from __future__ import annotations

import datetime

import pytest
import torchstep
from torchx.specs import AppDef, RetryPolicy, Role


def two_roles() -> AppDef:
    def role(name: str, **opts: float) -> Role:
        return Role(
            name,
            image="img:1",
            entrypoint="python",
            args=["-c", "pass"],
            max_retries=2,
            retry_policy=RetryPolicy.APPLICATION,
            metadata={"torchstep": opts},
        )

    # the first role owns the step's timing (the larger budget wins, the first on a tie)
    return AppDef("two", [role("a", retry_delay=5, retry_backoff=2, max_retry_delay=8), role("b", retry_delay=1)])


@pytest.mark.parametrize("target", ["local", "kubernetes", "kfp"])
def test_every_target_plans_the_same_waits(target: str) -> None:
    step = torchstep.build_plan(two_roles(), target).step_retry
    assert (step.count, step.delays(), step.role_index) == (2, [5.0, 8.0], 0)


@pytest.mark.parametrize("target", ["local", "kubernetes", "kfp"])
def test_explain_prints_the_waits(target: str) -> None:
    rows = [
        line for line in torchstep.explain(two_roles(), target, width=400).splitlines() if line.startswith("retries ")
    ]
    assert len(rows) == 1
    assert "5 s, 8 s" in rows[0] and "| yes " in rows[0]


def test_explain_says_when_the_orchestrator_default_applies() -> None:
    app = two_roles()
    for r in app.roles:
        r.metadata = {}
    row = next(
        line for line in torchstep.explain(app, "kubernetes", width=400).splitlines() if line.startswith("retries ")
    )
    assert "default delay" in row


def test_airflow_task_arguments_carry_the_same_timing() -> None:
    from airflow.sdk import DAG
    from torchstep_airflow import AppDefOperator

    with DAG("retry_delays", schedule=None):
        op = AppDefOperator(task_id="t", app=two_roles(), target="local")
    assert op.retries == 2
    assert op.retry_delay == datetime.timedelta(seconds=5)
    assert op.retry_exponential_backoff == 2
    assert op.max_retry_delay == datetime.timedelta(seconds=8)
