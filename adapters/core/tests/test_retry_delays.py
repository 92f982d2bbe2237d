"""One rule for the step's retry waits (StepRetry.delays): a two-role app whose roles set
different delays is planned with the same waits on every target and in the explain table.
(The Airflow task arguments carry them too: adapters/airflow/tests/test_operator.py; the
local supervisor's real waits are measured in tests/local.)"""

from __future__ import annotations

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
