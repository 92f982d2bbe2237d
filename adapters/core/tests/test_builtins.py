"""Every TorchX builtin component of the installed torchx materialises and plans for every
target, or fails with a SpecError a user can act on (the field, and a fix)."""

from __future__ import annotations

import pytest
import torchstep
from torchx.specs.finder import get_components

TARGETS = ("local", "kubernetes", "kfp")

# Minimal valid `torchx run` arguments of the builtins (none needed for the others).
MINIMAL_ARGS: dict[str, list[str]] = {
    "dist.ddp": ["-j", "2x2", "--script", "train.py"],
    "dist.spmd": ["--script", "train.py"],
    "metrics.tensorboard": ["--logdir", "/logs"],
    "serve.torchserve": ["--model_path", "/models/m.mar", "--management_api", "http://serve:8081"],
    "utils.binary": ["--entrypoint", "/bin/true"],
    "utils.booth": ["--x1", "1.0", "--x2", "2.0"],
    "utils.copy": ["--src", "/a", "--dst", "/b"],
    "utils.python": ["-c", "print(1)"],
    "utils.sh": ["echo", "hi"],
    "utils.touch": ["--file", "/tmp/x"],
}
# What a user is told on a target that cannot run a builtin as is: (field, words of the fix).
EXPECTED_REJECTIONS = {
    ("metrics.tensorboard", "kfp"): ("roles[0].port_map['http']", "target kubernetes"),
    ("serve.torchserve", "kfp"): ("roles[0].port_map['model-download']", "target kubernetes"),
}
BUILTINS = sorted(get_components())


def test_the_builtins_we_know_are_installed() -> None:
    # a builtin that disappears from torchx makes this table stale; new ones are still tested below
    assert {"dist.ddp", "utils.echo", "utils.sh", "utils.python", "utils.touch"} <= set(BUILTINS)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_plans_or_says_what_to_do(name: str, target: str) -> None:
    try:
        app = torchstep.materialize(name, MINIMAL_ARGS.get(name, []))
    except torchstep.SpecError as e:  # a builtin of a newer torchx whose arguments we do not know
        assert name not in MINIMAL_ARGS and e.fix and "required" in str(e), e
        return
    expected = EXPECTED_REJECTIONS.get((name, target))
    if expected is None:
        plan = torchstep.build_plan(app, target)
        assert plan.target == target and [r.name for r in plan.roles] == [r.name for r in app.roles]
        for planned, role in zip(plan.roles, app.roles, strict=True):
            assert planned.args == tuple(role.args) and dict(planned.env) == role.env
        # TorchX's default image has no torchstep: a pod or KFP step of it would fail at once
        head = torchstep.explain(app, target).splitlines()[0]
        lacking = [f"roles[{i}].image" for i, r in enumerate(app.roles) if r.image.startswith("ghcr.io/pytorch/torchx")]
        if target == "local" or not lacking:
            assert head.endswith("— OK") and not plan.warnings, (head, plan.warnings)
        else:
            assert head.endswith(f"— {len(lacking)} warning(s)"), head
            assert [w.field for w in plan.warnings] == lacking and all(
                "torchstep[agent]" in (w.fix or "") for w in plan.warnings
            )
        return
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan(app, target)
    field, fix = expected
    assert (err.value.field, err.value.target) == (field, target) and fix in (err.value.fix or "")
    assert "REJECTED" in torchstep.explain(app, target)


def test_ddp_plan() -> None:
    plan = torchstep.build_plan(torchstep.materialize("dist.ddp", MINIMAL_ARGS["dist.ddp"]), "kfp")
    r = plan.roles[0]
    assert (r.num_replicas, r.min_replicas, r.nproc_per_node, r.uses_torchrun) == (2, 2, 2, True)
    assert [(p.name, p.port) for p in r.ports] == [("c10d", 29500)]
    elastic = torchstep.build_plan(torchstep.materialize("dist.ddp", ["-j", "1:3x4", "--script", "t.py"]), "kubernetes")
    assert (elastic.roles[0].nnodes, elastic.roles[0].nproc_per_node) == ("1:3", 4)
