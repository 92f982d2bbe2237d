"""What the supervisor decides before starting anything (no processes): the GPU partition
with a fake device count, the mount rewrite, run options."""

from __future__ import annotations

import doctest
import importlib

import pytest
import torchstep
from torchstep.local.options import resolve
from torchstep.local.prepare import prepare
from torchx import specs


def plan_of(*roles: specs.Role) -> torchstep.StepPlan:
    return torchstep.build_plan(specs.AppDef("p", roles=list(roles)), "local")


def test_gpus_are_partitioned_across_replicas() -> None:
    res = specs.Resource(cpu=-1, gpu=2, memMB=-1)
    plan = plan_of(
        specs.Role("a", image="x", entrypoint="python", num_replicas=2, resource=res),
        specs.Role("b", image="x", entrypoint="python", resource=specs.Resource(cpu=-1, gpu=1, memMB=-1)),
        specs.Role("c", image="x", entrypoint="python"),
    )
    reps = prepare(plan, resolve({"gpus": "0;1;2;3;4;5"}), app_id="p-1").replicas
    visible = {(r.role.name, r.replica_id): r.env.get("CUDA_VISIBLE_DEVICES") for r in reps}
    assert visible == {("a", 0): "0,1", ("a", 1): "2,3", ("b", 0): "4", ("c", 0): None}

    with pytest.raises(torchstep.SpecError) as err:  # 5 asked, 4 present
        prepare(plan, resolve({"gpus": ["0", "1", "2", "3"]}), app_id="p-2")
    assert err.value.field == "roles[1].resource.gpu" and "this machine has 4 GPU(s)" in str(err.value)


def test_a_mount_destination_is_rewritten_to_the_host_path(tmp_path) -> None:
    plan = plan_of(
        specs.Role(
            "t",
            image="x",
            entrypoint="bash",
            args=["-c", "cat /data/x /data2/y; ls /data"],
            env={"IN": "/data/in", "OTHER": "/x/data"},
            mounts=[specs.BindMount(src_path=str(tmp_path), dst_path="/data")],
        )
    )
    (rep,) = prepare(plan, resolve({}), app_id="p-3").replicas
    assert rep.role.args == ("-c", f"cat {tmp_path}/x /data2/y; ls {tmp_path}")
    assert (rep.env["IN"], rep.env["OTHER"]) == (f"{tmp_path}/in", "/x/data")


def test_run_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    opts = resolve({"grace_period": "2.5", "tee": "false", "retries": 3})
    assert (opts.grace_period, opts.tee, opts.retries) == (2.5, False, 3)
    for cfg, field in (({"grace": 1}, "cfg['grace']"), ({"retries": "two"}, "cfg['retries']")):
        with pytest.raises(torchstep.SpecError) as err:
            resolve(cfg)
        assert err.value.field == field
    from torchstep.cli import main

    assert main(["runopts", "local"]) == 0  # `torchstep runopts local`: typed, with defaults and help
    assert "grace_period=GRACE_PERIOD (float, 10.0)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "name", ["options", "resources", "mounts", "prepare", "store", "status", "appfile", "supervisor"]
)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(f"torchstep.local.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
