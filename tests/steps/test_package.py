"""torchstep.steps: the names adapters import stay importable from the package; the rules
re-exported with them."""

from __future__ import annotations

import pytest
import torchstep
import torchstep.steps as steps
from torchstep.steps import check_user_retries
from torchx import specs


def test_the_names_every_adapter_imports_come_from_the_package() -> None:
    for name in (
        "Attempt",
        "open_step",
        "run_tries",
        "failure_summary",
        "check_user_retries",
        "run_local",
        "run_with_deadline",
        "stop_on_signals",
        "step_run_id",
        "StepBackend",
    ):
        assert name in steps.__all__ and callable(getattr(steps, name)), name
    assert torchstep.run_local is steps.run_local


def test_check_user_retries_names_the_field_and_the_fix() -> None:
    app_retry = specs.Role("w", image="", entrypoint="true", max_retries=2)
    plan = torchstep.build_plan(specs.AppDef("a", roles=[app_retry]), "local")
    check_user_retries(plan, retries=2)
    check_user_retries(plan)
    with pytest.raises(torchstep.SpecError, match="set the count in one place") as err:
        check_user_retries(plan, retries=3, orchestrator="Prefect")
    assert err.value.field == "roles[0].max_retries" and "Prefect" in str(err.value)

    replica = specs.Role("w", image="", entrypoint="true", max_retries=2, retry_policy=specs.RetryPolicy.REPLICA)
    plan = torchstep.build_plan(specs.AppDef("a", roles=[replica]), "local")
    check_user_retries(plan, retries=0)
    with pytest.raises(torchstep.SpecError, match="multiply the retry layers") as err:
        check_user_retries(plan, retries=1)
    assert err.value.field == "roles[0].retry_policy"

    timed = specs.AppDef(
        "a", roles=[specs.Role("w", image="", entrypoint="true")], metadata={"torchstep.timeout": "600"}
    )
    plan = torchstep.build_plan(timed, "local")
    check_user_retries(plan, timeout=900)
    for bad in (60, float("nan"), -1, True):
        with pytest.raises(torchstep.SpecError):
            check_user_retries(plan, timeout=bad)
