"""torchstep works with torchx 0.7.0 and with torchx-nightly (the isolated check runs this
file in a venv with a pinned torchx-nightly): nightly-only API (RetryPolicy.ROLE, the
``dist.torchrun`` builtin) is used when present, and 0.7.0-only API (HOT_SPARE) is not
required."""

from __future__ import annotations

import pytest
import torchstep
from torchx import specs
from torchx.specs.finder import get_components

TARGETS = ("local", "kubernetes", "kfp")
DIST = [name for name in ("dist.ddp", "dist.torchrun") if name in get_components()]


@pytest.mark.parametrize("name", DIST)
@pytest.mark.parametrize("target", TARGETS)
def test_torchrun_builtins_plan_with_their_own_torchrun(name: str, target: str) -> None:
    app = torchstep.materialize(name, ["-j", "2x2", "--script", "train.py", "--image", "ghcr.io/acme/train:1"])
    role = torchstep.build_plan(app, target).roles[0]
    assert (role.uses_torchrun, role.nproc_per_node, role.nnodes) == (True, 2, "2")
    assert "OK" in torchstep.explain(app, target).splitlines()[0]


@pytest.mark.parametrize("policy", [p.name for p in specs.RetryPolicy])
def test_every_retry_policy_of_this_torchx_has_one_owner(policy: str) -> None:
    app = torchstep.materialize("utils.echo", ["--msg", "hi"])
    app.roles[0].retry_policy = specs.RetryPolicy[policy]
    app.roles[0].max_retries = 2
    for target in TARGETS:
        budget = torchstep.build_plan(app, target).roles[0].retry
        layers = [budget.agent_restarts, budget.orchestrator_retries, budget.role_retries]
        assert sorted(layers) == [0, 0, 2], (policy, target, budget)


@pytest.mark.skipif(not hasattr(specs.RetryPolicy, "ROLE"), reason="RetryPolicy.ROLE exists in torchx-nightly only")
def test_role_policy_is_the_kubernetes_jobs_backoff_limit() -> None:
    app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    app.roles[0].retry_policy = specs.RetryPolicy.ROLE
    app.roles[0].max_retries = 2
    job = next(o for o in torchstep.kubernetes.render(app, namespace="ml") if o["kind"] == "Job")
    assert job["spec"]["backoffLimit"] == 2 * 2  # every replica of the role, N times


def test_installing_torchstep_keeps_every_builtin_scheduler_of_this_torchx() -> None:
    """0.7.0 hides its built-ins once a plugin exists (we re-register them); nightly merges
    them with plugins and dropped some (a dropped name fails with the fix, not ImportError)."""
    from torchstep.schedulers import builtins
    from torchx.schedulers import DEFAULT_SCHEDULER_MODULES, get_scheduler_factories

    factories = get_scheduler_factories()
    assert set(DEFAULT_SCHEDULER_MODULES) | {"torchstep_local"} <= set(factories)
    assert type(factories["local_cwd"]("t")).__module__ == "torchx.schedulers.local_scheduler"
    for name in set(builtins.BUILTINS) - set(DEFAULT_SCHEDULER_MODULES):
        with pytest.raises(ValueError, match=f"{name}.*not part of the installed torchx.*fix"):
            builtins.create(name, "t")


def test_an_appdef_survives_the_json_round_trip_of_the_schedulers() -> None:
    from torchstep.components.appjson import app_from_dict, app_to_dict

    app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    assert app_from_dict(app_to_dict(app)) == app
