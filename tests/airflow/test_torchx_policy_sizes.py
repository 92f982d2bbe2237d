"""The generic DAG's entry (``app_from_conf``) under DEFAULT against a stranger's DAG-run
conf (issue 33): a request too large is refused by its size before it is parsed, one with
too many roles by the policy before it is planned, a GPU under another name by the
extended-resource allow-list — each a PolicyError naming the field, with no planning done."""

from __future__ import annotations

import pytest
from torchstep.components.appjson import app_to_dict
from torchstep.policy import PolicyError
from torchx import specs


def conf(roles: list[specs.Role], target: str = "local") -> dict:
    return {"app": app_to_dict(specs.AppDef("payload", roles=roles)), "target": target, "cfg": {}}


def role(i: int = 0, **kw) -> specs.Role:
    return specs.Role(f"r{i}", image="ghcr.io/acme/tool:1", entrypoint="sh", args=["-c", "true"], **kw)


@pytest.fixture
def planned(monkeypatch) -> list[str]:
    import torchstep.plan.planner as planner

    calls: list[str] = []
    real = planner.build_plan
    monkeypatch.setattr(planner, "build_plan", lambda app, target: calls.append(target) or real(app, target))
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)  # the deployment names none: DEFAULT
    return calls


def test_a_strangers_oversized_confs_are_refused_before_planning(planned):
    from torchstep_airflow.torchx_dag import app_from_conf

    with pytest.raises(PolicyError, match=r"^conf\['app'\] \(target 'local'\): the request is more than 262144 bytes"):
        app_from_conf(conf([role(i) for i in range(2000)]))  # ~450 KB of JSON
    with pytest.raises(PolicyError, match=r"^app\.roles \(target 'local'\): 100 roles is more than"):
        app_from_conf(conf([role(i) for i in range(100)]))
    with pytest.raises(PolicyError, match=r"^app\.roles\[0\]\.num_replicas .*at most 16"):
        app_from_conf(conf([role(num_replicas=10_000)]))
    mig = role(resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={"nvidia.com/mig-3g.40gb": 7}))
    with pytest.raises(PolicyError, match=r"^app\.roles\[0\]\.resource\.devices\['nvidia\.com/mig-3g\.40gb'\]"):
        app_from_conf(conf([mig], "kubernetes"))
    assert planned == []
    app, target, cfg = app_from_conf(conf([role(i, num_replicas=2) for i in range(3)]))
    assert (len(app.roles), target, planned) == (3, "local", ["local"])
