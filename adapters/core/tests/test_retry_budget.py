"""The retry budget table of docs/translation.md, for every policy: one owner per budget,
never two layers; and how the budget reaches the agent on every target."""

from __future__ import annotations

import enum
from typing import Any

import pytest
import torchstep
from torchstep.plan.agent_command import agent_argv, replica_env
from torchstep.plan.model import RETRY_OWNERS, RetryOwner, policy_name, retry_budget
from torchx.specs import AppDef, RetryPolicy, Role

TARGETS = ("local", "kubernetes", "kfp")

# The table of docs/translation.md ("Retries: one budget, one owner"), written out independently of the code under test.
TABLE = {
    "APPLICATION": RetryOwner.ORCHESTRATOR,
    "REPLICA": RetryOwner.AGENT,
    "HOT_SPARE": RetryOwner.AGENT,
    "ROLE": RetryOwner.ROLE,
}


class NightlyRetryPolicy(str, enum.Enum):
    """torchx-nightly's RetryPolicy (0.7.0 has no ROLE)."""

    REPLICA = "REPLICA"
    APPLICATION = "APPLICATION"
    HOT_SPARE = "HOT_SPARE"
    ROLE = "ROLE"


def test_the_table_is_the_documented_table() -> None:
    assert RETRY_OWNERS == TABLE
    assert {p.name for p in RetryPolicy} <= set(TABLE)  # every policy of the installed torchx


POLICIES = [*RetryPolicy, *NightlyRetryPolicy, *TABLE]  # enum members of both versions, and names


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: f"{type(p).__name__}.{getattr(p, 'name', p)}")
@pytest.mark.parametrize("count", [0, 1, 5])
def test_every_policy_has_exactly_one_owner(policy: Any, count: int) -> None:
    name = policy_name(policy)
    assert name is not None
    budget = retry_budget(policy, count)
    owner = TABLE[name] if count else RetryOwner.NONE
    assert (budget.policy, budget.owner, budget.count) == (name, owner, count)
    spent = [budget.agent_restarts, budget.orchestrator_retries, budget.role_retries]
    assert sum(spent) == count and sum(1 for s in spent if s) == (1 if count else 0)


@pytest.mark.parametrize("bad", ["replica", "ALWAYS", None, 3, ["REPLICA"]])
def test_unknown_policy_is_a_spec_error(bad: Any) -> None:
    with pytest.raises(torchstep.SpecError) as err:
        retry_budget(bad, 1)
    assert err.value.field == "retry_policy" and "APPLICATION, REPLICA, HOT_SPARE, ROLE" in (err.value.fix or "")


@pytest.mark.parametrize("bad", [-1, 1001, True, 1.0])
def test_bad_count_is_a_spec_error(bad: Any) -> None:
    with pytest.raises(torchstep.SpecError) as err:
        retry_budget("REPLICA", bad)
    assert err.value.field == "max_retries"


def role(name: str = "trainer", **kw: Any) -> Role:
    return Role(name, image="img:1", entrypoint="python", args=["t.py"], **kw)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("policy", [*RetryPolicy, NightlyRetryPolicy.ROLE, "ROLE"], ids=str)
def test_plans_carry_the_budget_to_its_owner_only(policy: Any, target: str) -> None:
    plan = torchstep.build_plan(AppDef("a", [role(max_retries=2, retry_policy=policy, num_replicas=2)]), target)
    r = plan.roles[0]
    owner = TABLE[str(policy_name(policy))]
    assert r.retry.owner is owner and plan.retry_owner is owner
    assert plan.orchestrator_retries == (2 if owner is RetryOwner.ORCHESTRATOR else 0)
    argv = agent_argv(r, rdzv_endpoint="h:29500", rdzv_id="x")
    restarts = argv[argv.index("--max-restarts") + 1]
    assert restarts == ("2" if owner is RetryOwner.AGENT else "0")


@pytest.mark.parametrize("target", TARGETS)
def test_two_layers_across_roles_are_rejected(target: str) -> None:
    app = AppDef("a", [role(max_retries=1), role("ps", max_retries=1, retry_policy=RetryPolicy.REPLICA)])
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan(app, target)
    assert err.value.field == "roles[1].retry_policy" and "two layers" in str(err.value)
    # a role without retries does not make a second layer
    app.roles[1].max_retries = 0
    assert torchstep.build_plan(app, target).retry_owner is RetryOwner.ORCHESTRATOR


@pytest.mark.parametrize("target", TARGETS)
def test_roles_that_retry_themselves_do_not_multiply(target: str) -> None:
    app = AppDef(
        "a",
        [role(max_retries=2, retry_policy=RetryPolicy.REPLICA), role("ps", max_retries=1, retry_policy="ROLE")],
    )
    plan = torchstep.build_plan(app, target)
    assert [r.retry.owner for r in plan.roles] == [RetryOwner.AGENT, RetryOwner.ROLE]
    assert plan.orchestrator_retries == 0


@pytest.mark.parametrize("target", TARGETS)
def test_application_budgets_that_differ_use_the_largest_and_say_so(target: str) -> None:
    plan = torchstep.build_plan(AppDef("a", [role(max_retries=1), role("ps", max_retries=3)]), target)
    assert plan.orchestrator_retries == 3
    rows = [d for d in plan.decisions if d.field == "roles[0].max_retries"]
    assert any("retried as a whole: 3 times" in d.becomes for d in rows)


def ddp(restarts: str = "", **kw: Any) -> AppDef:
    cmd = f"torchrun --nnodes 2 --nproc_per_node 2 {restarts} train.py"
    return AppDef("a", [Role("t", image="img:1", entrypoint="bash", args=["-c", cmd], num_replicas=2, **kw)])


@pytest.mark.parametrize("target", TARGETS)
def test_own_torchrun_gets_the_agent_budget_through_the_environment(target: str) -> None:
    plan = torchstep.build_plan(ddp(max_retries=3, retry_policy=RetryPolicy.REPLICA), target)
    r = plan.roles[0]
    assert r.uses_torchrun and r.retry.agent_restarts == 3
    assert agent_argv(r, rdzv_endpoint="h:1", rdzv_id="x") == r.argv  # argv untouched: the shim runs it
    env = replica_env(r, app_id="a-1", replica_id=1, rank0_host="h")
    assert env["PET_MAX_RESTARTS"] == "3" and env["PET_NPROC_PER_NODE"] == "2"


@pytest.mark.parametrize("target", TARGETS)
def test_own_torchrun_restarts_are_one_layer_only(target: str) -> None:
    # the command's own --max-restarts, with the same budget: fine
    assert torchstep.build_plan(ddp("--max-restarts 3", max_retries=3, retry_policy="REPLICA"), target)
    # ... in the role's env instead of the command: checked the same way
    app = ddp(max_retries=1, env={"PET_MAX_RESTARTS": "2"})
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan(app, target)
    assert err.value.field == "roles[0].env['PET_MAX_RESTARTS']"
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan(ddp("--max-restarts ${N}"), target)
    assert err.value.field == "roles[0].args" and "write the number" in (err.value.fix or "")


def test_kfp_says_it_retries_one_roles_task() -> None:
    plan = torchstep.build_plan(AppDef("a", [role(max_retries=1), role("ps")]), "kfp")
    rows = [d.becomes for d in plan.decisions if d.field == "roles[0].retry_policy"]
    assert any("retries this role's task alone" in b for b in rows)
