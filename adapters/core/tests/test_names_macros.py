"""Kubernetes-safe names (deterministic at build time, run-unique suffix only at run
time) and TorchX macros (found and bound exactly as TorchX binds them)."""

from __future__ import annotations

import re
import string

import torchstep
from hypothesis import given, settings
from hypothesis import strategies as st
from torchstep.plan.macros import Macro, find_macros, substitute, substitute_nested
from torchstep.plan.names import JOB_NAME_MAX, dns_label, is_dns_label, run_name
from torchx.specs import AppDef, Role, macros

LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
BOUNDED = settings(max_examples=200, deadline=None, derandomize=True, database=None)  # same examples every run


def test_dns_label_examples() -> None:
    assert dns_label("trainer") == "trainer"
    assert dns_label("Trainer_Main") == "trainer-main"
    assert dns_label("--a..b--") == "a-b"
    assert dns_label("模型") == dns_label("---") == ""
    long = dns_label("x" * 100, max_len=40)
    assert len(long) == 40 and long == dns_label("x" * 100, max_len=40)


@BOUNDED
@given(name=st.text(min_size=1, max_size=120), max_len=st.integers(min_value=8, max_value=63))
def test_dns_label_is_a_valid_deterministic_label(name: str, max_len: int) -> None:
    label = dns_label(name, max_len=max_len)
    assert label == dns_label(name, max_len=max_len)
    if label:
        assert LABEL.match(label) and len(label) <= max_len and is_dns_label(label, max_len=max_len)
    else:
        assert not any(c.isascii() and c.isalnum() for c in name.lower())


@BOUNDED
@given(label=st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z"))
def test_valid_short_labels_are_kept(label: str) -> None:
    if "--" not in label:
        assert dns_label(label) == label


@BOUNDED
@given(
    prefix=st.text(alphabet="abc", min_size=63, max_size=70), a=st.text("xyz", min_size=1), b=st.text("xyz", min_size=1)
)
def test_long_names_sharing_a_prefix_stay_distinct(prefix: str, a: str, b: str) -> None:
    if a != b:
        assert dns_label(prefix + a) != dns_label(prefix + b)


@BOUNDED
@given(base=st.text(min_size=1, max_size=80), run_id=st.text(min_size=1, max_size=40))
def test_run_name_is_a_job_name_stable_per_run(base: str, run_id: str) -> None:
    name = run_name(base, run_id)
    assert is_dns_label(name, max_len=JOB_NAME_MAX)
    assert name == run_name(base, run_id) != run_name(base, run_id + "x")


def test_run_name_without_run_id_is_fresh_each_time() -> None:
    names = {run_name("train-trainer") for _ in range(5)}
    assert len(names) == 5 and all(n.startswith("train-trainer-") for n in names)


def test_plan_names_fit_a_job_name_with_the_run_suffix() -> None:
    a = AppDef(
        "A" * 90, [Role("R" * 90, image="i:1", entrypoint="e"), Role("R" * 89 + "x", image="i:1", entrypoint="e")]
    )
    plan = torchstep.build_plan(a, "kubernetes")
    assert len(plan.k8s_name) <= 40 and all(len(r.k8s_name) <= 30 for r in plan.roles)
    jobs = {run_name(f"{plan.k8s_name}-{r.k8s_name}", "run-1") for r in plan.roles}
    assert len(jobs) == 2 and all(is_dns_label(j, max_len=JOB_NAME_MAX) for j in jobs)


# ---- macros ---------------------------------------------------------------------------------
def test_find_macros_parses_like_template() -> None:
    assert find_macros(["${app_id}", "$replica_id/x", "${img_root}"]) == {
        Macro.APP_ID,
        Macro.REPLICA_ID,
        Macro.IMG_ROOT,
    }
    assert find_macros(["$${app_id}", "$app_idx", "${unknown}", "$", "no macros"]) == frozenset()
    assert find_macros(["$${${rank0_env}:=localhost}:29500"]) == {Macro.RANK0_ENV}  # dist.ddp's endpoint


def test_dist_ddp_endpoint_binds_to_a_shell_default() -> None:
    role = torchstep.build_plan(torchstep.materialize("dist.ddp", ["-j", "2x1", "--script", "t.py"]), "local").roles[0]
    values = {"app_id": "train-1", "replica_id": "0", "rank0_env": "TORCHX_RANK0_HOST", "img_root": ""}
    argv, _ = role.bind(values)
    assert "${TORCHX_RANK0_HOST:=localhost}:29500" in argv[2] and "--rdzv_id 'train-1'" in argv[2]
    assert "${app_id}" in role.args[1]  # the plan itself stays raw


TEXT = st.text(alphabet=string.ascii_letters + "${}_ -:=0'\"\n", max_size=40) | st.sampled_from(
    [m.placeholder for m in Macro] + ["$app_id", "$$", "$${app_id}", "${", "$ {app_id}"]
)


@BOUNDED
@given(parts=st.lists(TEXT, max_size=6))
def test_binding_is_torchx_binding(parts: list[str]) -> None:
    text = "".join(parts)
    values = macros.Values(img_root="/img", app_id="app-1", replica_id="3", rank0_env="TORCHX_RANK0_HOST")
    ours = {"img_root": "/img", "app_id": "app-1", "replica_id": "3", "rank0_env": "TORCHX_RANK0_HOST"}
    ours["base_img_root"] = values.base_img_root
    assert substitute(text, ours) == values.substitute(text)


def test_role_binding_matches_torchx_apply() -> None:
    r = Role(
        "t",
        image="i",
        entrypoint="${img_root}/bin/run",
        args=["--id", "${app_id}", "$$HOME", "r$replica_id"],
        env={"RANK0": "${rank0_env}"},
        metadata={"kubernetes": {"labels": {"run": "${app_id}"}, "list": ["${replica_id}"]}},
    )
    plan_role = torchstep.build_plan(AppDef("a", [r]), "kubernetes").roles[0]
    values = macros.Values(img_root="", app_id="a-1", replica_id="2", rank0_env="TORCHX_RANK0_HOST")
    bound = values.apply(r)
    args = {"img_root": "", "app_id": "a-1", "replica_id": "2", "rank0_env": "TORCHX_RANK0_HOST"}
    argv, env = plan_role.bind(args)
    assert argv == [bound.entrypoint, *bound.args] and env == bound.env
    assert plan_role.bound_metadata(args) == bound.metadata
    assert substitute_nested({"x": ["$app_id", {"y": "${app_id}"}]}, args) == {"x": ["a-1", {"y": "a-1"}]}
    assert plan_role.macros == {Macro.APP_ID, Macro.REPLICA_ID, Macro.RANK0_ENV}  # not the entrypoint's
