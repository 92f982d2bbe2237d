"""The kubernetes run option ``store_takeover``: which roles get the agent's store move and
where a late agent looks for the moved store (the other replicas' FQDNs), in the container's
``--rdzv-conf`` and in ``TORCHSTEP_RDZV_CONF`` alike."""

from __future__ import annotations

from typing import Any

import pytest
import torchstep
from torchx import specs


def rdzv_confs(role: specs.Role, **cfg: Any) -> tuple[str, str]:
    objs = torchstep.kubernetes.render(specs.AppDef("st", roles=[role]), namespace="ml", cfg={"run_id": "r", **cfg})
    job = next(o for o in objs if o["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    return args[args.index("--rdzv-conf") + 1], env["TORCHSTEP_RDZV_CONF"]


def role(**kw: Any) -> specs.Role:
    return specs.Role("t", image="img", entrypoint="python", args=["t.py"], **kw)


def test_an_elastic_role_gets_the_move_and_every_other_replica_as_a_candidate() -> None:
    flag, env = rdzv_confs(role(num_replicas=3, min_replicas=1))  # on by default
    assert flag == env == rdzv_confs(role(num_replicas=3, min_replicas=1), store_takeover="true")[0]
    conf = dict(kv.split("=", 1) for kv in flag.split(","))
    assert conf["store_takeover"] == "on"
    hosts = conf["store_candidates"].split("|")
    assert [h.split(".")[0].rsplit("-", 1)[1] for h in hosts] == ["1", "2"]  # replicas 1 and 2, not 0
    assert all(h.endswith(".ml.svc.cluster.local") for h in hosts)


@pytest.mark.parametrize(
    ("kw", "cfg"),
    [
        ({"num_replicas": 3, "min_replicas": 1}, {"store_takeover": False}),  # torchrun's way, when asked
        ({"num_replicas": 3}, {"store_takeover": True}),  # a fixed size fails fast instead
        ({"num_replicas": 3}, {}),
    ],
)
def test_no_move_when_turned_off_or_for_a_fixed_size(kw: dict[str, Any], cfg: dict[str, Any]) -> None:
    flag, env = rdzv_confs(role(**kw), **cfg)
    assert "store_takeover" not in flag and "store_takeover" not in env


def test_a_bad_value_names_the_option() -> None:
    with pytest.raises(torchstep.SpecError, match=r"cfg\['store_takeover'\]"):
        rdzv_confs(role(num_replicas=2, min_replicas=1), store_takeover="maybe")


def test_the_lease_witness_is_rendered_with_the_move_unless_turned_off() -> None:
    conf = dict(kv.split("=", 1) for kv in rdzv_confs(role(num_replicas=2, min_replicas=1))[0].split(","))
    assert conf["store_witness"] == "kubernetes"  # an even split (two replicas) has a witness by default
    flag, env = rdzv_confs(role(num_replicas=2, min_replicas=1), store_witness=False)
    assert "store_witness" not in flag and "store_witness" not in env and "store_takeover=on" in flag
    flag, _ = rdzv_confs(role(num_replicas=2, min_replicas=1), store_takeover=False)  # no move: no witness either
    assert "store_witness" not in flag
    with pytest.raises(torchstep.SpecError, match=r"cfg\['store_witness'\]"):
        rdzv_confs(role(num_replicas=2, min_replicas=1), store_witness="perhaps")
