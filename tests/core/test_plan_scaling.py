"""Planning is linear in the AppDef's size (issue 33, item 4): a ~1 MB DAG-run conf of
10,000 roles cost an Airflow worker minutes of CPU because every rule re-scanned every
decision recorded so far. Measured by counting the Python calls planning makes (the same
on a quiet or a loaded machine), never by timing."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from torchstep.plan.planner import build_plan, plan_decisions
from torchx import specs


def calls(fn: Callable[[], Any]) -> int:
    """How many Python functions (generator resumptions included) ``fn()`` runs."""
    n = 0

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal n
        if event == "call":
            n += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return n


def roles_app(n: int, *, bad: bool = False) -> specs.AppDef:
    roles = [
        specs.Role(
            f"r{i}",
            image="ghcr.io/acme/t:1",
            entrypoint="python",
            args=["-m", "train", f"--shard={i}"],
            env={"SHARD": str(i)},
            resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={"x/y!": 1} if bad else {}),
        )
        for i in range(n)
    ]
    return specs.AppDef("wide", roles=roles)


def one_role_app(n: int) -> specs.AppDef:
    role = specs.Role(
        "r",
        image="ghcr.io/acme/t:1",
        entrypoint="python",
        args=[f"--a{i}" for i in range(n)],
        env={f"E{i}": "v" for i in range(n)},
        mounts=[specs.VolumeMount(src=f"claim{i}", dst_path=f"/m/{i}") for i in range(n)],
        metadata={
            "kubernetes": {"volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(n)]},
            "x": list(range(n)),
        },
    )
    return specs.AppDef("long", roles=[role])


@pytest.mark.parametrize(
    "make, plan",
    [
        (roles_app, lambda a: build_plan(a, "kubernetes")),
        (roles_app, lambda a: build_plan(a, "local")),
        (lambda n: roles_app(n, bad=True), lambda a: plan_decisions(a, "kubernetes")),  # every role rejected
        (one_role_app, lambda a: build_plan(a, "kubernetes")),
    ],
    ids=["roles-kubernetes", "roles-local", "rejected-roles-explain", "one-long-role"],
)
def test_planning_four_times_the_app_costs_about_four_times_the_calls(make, plan):
    """N and 4N roles (or fields): 4x the calls, within 15 %; a rule that re-scanned the
    decisions so far made 4N cost ~12x (1,000 roles: 50 million calls)."""
    small, large = make(150), make(600)
    plan(small)  # imports and caches warmed outside the count
    ratio = calls(lambda: plan(large)) / calls(lambda: plan(small))
    assert ratio < 4 * 1.15, f"4x the AppDef cost {ratio:.1f}x the calls"


def test_a_rejected_field_still_fails_its_own_role_only():
    """The rejections kept per role: a rejected field of roles[1] fails roles[1] (all its
    fields are reported), and roles[10] with a valid spelling plans (no prefix mix-up)."""
    app = roles_app(12)
    app.roles[1].resource.devices = {"not a name": 1}
    decisions = plan_decisions(app, "kubernetes")
    rejected = [d.field for d in decisions if d.action == "rejected"]
    assert rejected == ["roles[1].resource.devices['not a name']"]
    with pytest.raises(Exception, match=r"roles\[1\]\.resource\.devices"):
        build_plan(app, "kubernetes")
    app.roles[1].resource.devices = {}
    assert [r.name for r in build_plan(app, "kubernetes").roles] == [f"r{i}" for i in range(12)]
