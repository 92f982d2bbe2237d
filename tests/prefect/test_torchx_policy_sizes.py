"""The generic flow's entry (``load_app``) under DEFAULT against a stranger's flow-run
parameters (issue 33): size first, then the policy, and only then the plan."""

from __future__ import annotations

import pytest
from torchstep.components.appjson import app_to_dict
from torchstep.policy import PolicyError
from torchx import specs


def data(roles: list[specs.Role]) -> dict:
    return app_to_dict(specs.AppDef("payload", roles=roles))


def role(i: int = 0, **kw) -> specs.Role:
    return specs.Role(f"r{i}", image="ghcr.io/acme/tool:1", entrypoint="sh", args=["-c", "true"], **kw)


def test_a_strangers_oversized_parameters_are_refused_before_planning(monkeypatch):
    import torchstep.plan.planner as planner
    from torchstep_prefect.torchx_flow import load_app

    planned: list[str] = []
    real = planner.build_plan
    monkeypatch.setattr(planner, "build_plan", lambda app, target: planned.append(target) or real(app, target))
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)
    with pytest.raises(PolicyError, match=r"^app \(target 'local'\): the request is more than 262144 bytes"):
        load_app(data([role(i) for i in range(2000)]), "local")
    with pytest.raises(PolicyError, match=r"^app\.roles \(target 'kubernetes'\): 17 roles"):
        load_app(data([role(i) for i in range(17)]), "kubernetes")
    with pytest.raises(PolicyError, match=r"^cfg\['grace_period'\] \(target 'local'\).*at most 300 seconds"):
        load_app(data([role()]), "local", cfg={"grace_period": 2147483647})
    with pytest.raises(PolicyError, match=r"^app\.roles\[0\]\.env\['NCCL_NET_PLUGIN'\]"):
        load_app(data([role(env={"NCCL_NET_PLUGIN": "/tmp/evil.so"})]), "local")
    assert planned == []
    assert load_app(data([role()]), "local").roles[0].name == "r0" and planned == ["local"]
