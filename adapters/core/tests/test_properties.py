"""Property-based: for generated AppDefs, valid and broken, ``build_plan`` returns a plan
or raises SpecError (never any other exception), ``explain`` never raises, args and env
reach the plan byte for byte, and no field of a planned AppDef is without a row."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

import torchstep
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torchstep.errors import SpecError
from torchstep.plan.limits import KNOWN_CAPABILITIES
from torchstep.plan.model import ROLE_OPTIONS, StepPlan
from torchstep.plan.planner import plan_decisions
from torchx.specs import AppDef, BindMount, DeviceMount, Resource, RetryPolicy, Role, VolumeMount

TARGETS = ("local", "kubernetes", "kfp")
# derandomize: the same examples every run (CI is deterministic); bounded: seconds, not minutes
BOUNDED = settings(
    max_examples=200, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# text a user could put anywhere: shell metacharacters, quotes, newlines, templates, macros
NASTY = st.sampled_from(
    [
        "; rm -rf / && echo $HOME | cat > /tmp/x &",
        "it's \"quoted\" and 'single'",
        "line1\nline2\r\n\ttab",
        "{{ params.lr }}",
        "{{ ti.xcom_pull('x') }}",
        "${app_id}",
        "$${rank0_env}",
        "$replica_id$",
        "`whoami` $(id)",
        "--flag=--other",
        "模型训练 ümlaut 🚀",
        "\\backslash\\",
        "",
        " ",
        "\x00nul",
    ]
)
TEXT = st.one_of(NASTY, st.text(max_size=30))
JUNK = st.one_of(st.none(), st.integers(-5, 5), st.floats(allow_nan=True), st.lists(st.integers(), max_size=2))
VALID_NAMES = st.one_of(
    st.sampled_from(["trainer", "Trainer_Main", "ps", "a-b", "x" * 80, "训练-v2"]),
    st.from_regex(r"\A[A-Za-z][A-Za-z0-9_.-]{0,70}\Z"),
)
BROKEN_NAMES = st.one_of(st.sampled_from(["训练", "", " ", "a/b", ".", "r\n"]), st.text(max_size=70), JUNK)


def mostly(valid: st.SearchStrategy[Any], broken: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``valid``, or ``broken`` one time in N, N drawn once per example (shared): in half
    of the examples 1 in 20 (whole AppDefs are often valid, so the plan path is
    exercised), in the other half 1 in 3 (every broken branch is reached)."""
    one_in = st.shared(st.sampled_from([20, 3]), key="one_in")
    return one_in.flatmap(lambda n: st.sampled_from(range(n)).flatmap(lambda k: broken if k == 0 else valid))


VALID_PATHS = st.sampled_from(["/data", "/mnt/ds", "/dev/fuse", "/ckpt"])
PATHS = st.one_of(st.sampled_from(["data", "/", "ckpt", "My_Claim"]), TEXT)
MOUNTS = st.lists(
    mostly(
        st.one_of(
            st.builds(BindMount, src_path=VALID_PATHS, dst_path=VALID_PATHS, read_only=st.booleans()),
            st.builds(VolumeMount, src=st.sampled_from(["ckpt", "data-v1"]), dst_path=VALID_PATHS),
            st.builds(DeviceMount, src_path=VALID_PATHS, dst_path=VALID_PATHS),
        ),
        st.one_of(
            st.builds(BindMount, src_path=PATHS, dst_path=PATHS, read_only=st.booleans()),
            st.builds(VolumeMount, src=PATHS, dst_path=PATHS, read_only=st.booleans()),
            st.builds(DeviceMount, src_path=PATHS, dst_path=PATHS, permissions=st.sampled_from(["r", "rx", ""])),
            JUNK,
            st.just("type=bind,src=/a,dst=/b"),
        ),
    ),
    max_size=2,
    unique_by=lambda m: getattr(m, "dst_path", id(m)),
)
RESOURCES = mostly(
    st.builds(
        Resource,
        cpu=st.one_of(st.integers(-1, 64), st.sampled_from([0.5, 2.5])),
        gpu=st.integers(-1, 8),
        memMB=st.one_of(st.just(-1), st.integers(1, 2**20)),
        capabilities=st.dictionaries(
            st.sampled_from(sorted(KNOWN_CAPABILITIES)[:3]), st.just("p4d.24xlarge"), max_size=1
        ),
        devices=st.dictionaries(st.just("vpc.amazonaws.com/efa"), st.integers(0, 4), max_size=1),
    ),
    st.one_of(
        st.builds(
            Resource,
            cpu=st.one_of(
                st.integers(-3, 5000), st.floats(-2, 1e5), st.sampled_from([float("nan"), float("inf")]), JUNK
            ),
            gpu=st.one_of(st.integers(-3, 300), JUNK),
            memMB=st.one_of(st.integers(-3, 2**50), JUNK),
            capabilities=st.dictionaries(
                st.sampled_from([*sorted(KNOWN_CAPABILITIES)[:3], "gpu_type"]), TEXT, max_size=2
            ),
            devices=st.dictionaries(st.sampled_from(["vpc.amazonaws.com/efa", "efa", "x.io/y"]), JUNK, max_size=2),
        ),
        JUNK,
    ),
)
POLICIES = mostly(st.sampled_from([*RetryPolicy, "ROLE"]), st.one_of(st.sampled_from(["bogus", "replica"]), JUNK))
OPTIONS = st.dictionaries(
    st.sampled_from([*ROLE_OPTIONS, "timout", "nproc"]),
    st.one_of(
        st.integers(-5, 10**6),
        st.floats(allow_nan=True),
        TEXT,
        st.dictionaries(st.sampled_from(["HF_TOKEN", "1BAD", "A"]), st.sampled_from(["hf-token/token", "bad", ""])),
    ),
    max_size=3,
)
METADATA = mostly(
    st.dictionaries(st.sampled_from(["kubernetes", "mlflow"]), st.dictionaries(TEXT, TEXT, max_size=2), max_size=2),
    st.one_of(
        st.dictionaries(
            st.sampled_from(["torchstep", "kubernetes", "mlflow"]),
            st.one_of(OPTIONS, st.dictionaries(TEXT, TEXT, max_size=2), JUNK),
            max_size=3,
        ),
        JUNK,
    ),
)
TORCHRUN_ARGS = st.builds(
    lambda nnodes, nproc, extra: ["-c", f"torchrun --nnodes {nnodes} --nproc_per_node {nproc} {extra} train.py"],
    st.sampled_from(["1", "2", "1:2", "4", "$N", "x"]),
    st.sampled_from(["1", "2", "gpu", "0"]),
    st.sampled_from(["", "--max-restarts 2", "--max_restarts=0", "'unbalanced", "; echo torchrun"]),
)
ENV_NAMES = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z")


@st.composite
def roles(draw: st.DrawFn) -> Any:
    num = draw(mostly(st.integers(1, 4), st.one_of(st.integers(-1, 0), JUNK)))
    return Role(
        name=draw(mostly(VALID_NAMES, BROKEN_NAMES)),
        image=draw(
            mostly(st.just("ghcr.io/a/b:1"), st.one_of(st.sampled_from(["", "<MISSING>", "with space"]), TEXT, JUNK))
        ),
        entrypoint=draw(
            mostly(st.sampled_from(["python", "bash", "torchrun"]), st.one_of(st.just("<MISSING>"), TEXT, JUNK))
        ),
        args=draw(
            mostly(
                st.one_of(st.lists(TEXT, max_size=5), TORCHRUN_ARGS),
                st.one_of(st.lists(st.one_of(TEXT, JUNK), min_size=1, max_size=3), JUNK),
            )
        ),
        env=draw(
            mostly(
                st.dictionaries(ENV_NAMES, TEXT, max_size=3),
                st.one_of(
                    st.dictionaries(
                        st.one_of(TEXT, st.none(), st.integers(-5, 5)), st.one_of(TEXT, JUNK), min_size=1, max_size=2
                    ),
                    JUNK,
                ),
            )
        ),
        num_replicas=num,
        min_replicas=draw(mostly(st.one_of(st.none(), st.just(1)), st.one_of(st.integers(-1, 6), JUNK))),
        max_retries=draw(mostly(st.integers(0, 3), st.one_of(st.integers(-2, -1), st.just(1001), JUNK))),
        retry_policy=draw(POLICIES),
        resource=draw(RESOURCES),
        port_map=draw(
            mostly(
                st.dictionaries(st.sampled_from(["c10d", "tb"]), st.integers(1, 65535), max_size=2),
                st.one_of(
                    st.dictionaries(st.one_of(TEXT, st.none(), st.integers(-5, 5)), st.integers(-1, 70000), max_size=2),
                    JUNK,
                ),
            )
        ),
        metadata=draw(METADATA),
        mounts=draw(mostly(MOUNTS, JUNK)),
        base_image=draw(mostly(st.none(), TEXT)),
    )


APPS = st.builds(
    AppDef,
    name=mostly(VALID_NAMES, BROKEN_NAMES),
    roles=mostly(st.lists(roles(), min_size=1, max_size=3), st.lists(st.one_of(roles(), JUNK), max_size=3)),
    metadata=mostly(
        st.fixed_dictionaries({}, optional={"torchstep.timeout": st.just("3600"), "owner": TEXT}),
        st.one_of(
            st.dictionaries(st.sampled_from(["torchstep.x", "torchstep.timeout"]), st.one_of(TEXT, JUNK), max_size=2),
            JUNK,
        ),
    ),
)


def plan_or_spec_error(app: AppDef, target: str) -> StepPlan | None:
    try:
        return torchstep.build_plan(app, target)
    except torchstep.SpecError as e:
        assert isinstance(e.field, str) and e.field
        assert e.target in (target, None) and e.fix, e
        assert str(e).startswith(e.field)
        return None


@BOUNDED
@given(app=APPS)
def test_any_appdef_plans_or_raises_spec_error(app: AppDef, missing_rows: Any) -> None:
    for target in TARGETS:
        plan = plan_or_spec_error(app, target)
        text = torchstep.explain(app, target)
        assert text.startswith("torchstep explain: app ") and text.endswith("\n")
        if plan is None:
            assert "REJECTED" in text
            continue
        assert not any(d.action == "rejected" for d in plan_decisions(app, target))
        for role, rp in zip(app.roles, plan.roles, strict=True):
            assert (rp.entrypoint, rp.args, dict(rp.env)) == (role.entrypoint, tuple(role.args), role.env)
        assert missing_rows(app, plan.decisions) == set()


# ---- valid apps with nasty arguments: always planned, argv byte for byte ------------------------
@st.composite
def valid_apps(draw: st.DrawFn) -> AppDef:
    n = draw(st.integers(1, 3))
    roles = []
    for i in range(n):
        num = draw(st.integers(1, 4))
        roles.append(
            Role(
                name=f"role{i}-{draw(st.sampled_from(['a', 'b_c', 'D']))}",
                image="ghcr.io/acme/train:1",
                entrypoint=draw(st.sampled_from(["python", "bash", "/usr/bin/env"])),
                args=draw(st.lists(TEXT.filter(lambda s: "\x00" not in s), max_size=6)),
                env=draw(
                    st.dictionaries(
                        st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z"), TEXT.filter(lambda s: "\x00" not in s), max_size=3
                    )
                ),
                num_replicas=num,
                min_replicas=draw(st.one_of(st.none(), st.integers(1, num))),
                max_retries=draw(st.integers(0, 3)),
                retry_policy=draw(st.sampled_from([RetryPolicy.REPLICA, RetryPolicy.HOT_SPARE, "ROLE"])),
                resource=Resource(
                    cpu=draw(st.integers(1, 64)), gpu=draw(st.integers(0, 8)), memMB=draw(st.integers(1, 2**20))
                ),
                port_map={"c10d": 29500},
                mounts=[VolumeMount("ckpt", "/ckpt")] if draw(st.booleans()) else [],
            )
        )
    return AppDef(
        draw(st.text(min_size=1, max_size=60).filter(str.isprintable).map(lambda s: s.replace("/", "") or "a")), roles
    )


@BOUNDED
@given(app=valid_apps())
def test_valid_apps_plan_on_kubernetes_and_kfp_with_args_byte_for_byte(app: AppDef) -> None:
    for target in ("kubernetes", "kfp"):
        try:
            plan = torchstep.build_plan(app, target)
        except torchstep.SpecError as e:
            # the only refusals left: a role's own torchrun (nnodes) or a name without ASCII letters
            assert e.field == "name" or e.field.endswith((".args", ".name")), e
            continue
        for role, rp in zip(app.roles, plan.roles, strict=True):
            assert rp.args == tuple(role.args) and all(type(a) is str for a in rp.args)
            assert dict(rp.env) == role.env
            assert rp.argv == [role.entrypoint, *role.args]
        assert plan.k8s_name and all(r.k8s_name for r in plan.roles)


# ---- one field at a time, any value: every field x every kind of wrong value ---------------------
class Foreign(str, enum.Enum):
    ROLE = "ROLE"
    NOPE = "NOPE"


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.integers(-2, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.binary(max_size=5),
    st.lists(st.one_of(st.integers(), TEXT, st.none()), max_size=3),
    st.dictionaries(st.one_of(TEXT, st.integers()), st.one_of(TEXT, st.integers(), st.none()), max_size=3),
    st.sampled_from([object(), Foreign.ROLE, Foreign.NOPE, RetryPolicy.REPLICA, Resource(1, 0, 1), Role("r", "i")]),
)


def valid_app() -> AppDef:
    role = Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["train.py", "--lr", "0.1"],
        env={"A": "1"},
        num_replicas=2,
        min_replicas=1,
        max_retries=1,
        retry_policy=RetryPolicy.REPLICA,
        resource=Resource(cpu=2, gpu=0, memMB=1024, capabilities={"kubernetes.io/arch": "amd64"}, devices={}),
        port_map={"c10d": 29500},
        metadata={"torchstep": {"timeout": 60, "nproc_per_node": 2, "secret_env": {"T": "s/k"}}},
        mounts=[VolumeMount("ckpt", "/ckpt")],
    )
    return AppDef("train", [role], metadata={"torchstep.timeout": "600"})


def set_path(app: AppDef, path: str, value: Any) -> None:
    role = app.roles[0]
    owner, _, name = path.rpartition(".")
    if path.startswith("app."):
        setattr(app, name, value)
    elif owner == "role":
        setattr(role, name, value)
    elif owner == "resource":
        setattr(role.resource, name, value)
    elif owner == "mount":
        object.__setattr__(role.mounts[0], name, value)
    elif owner == "option":
        role.metadata["torchstep"][name] = value
    elif owner == "secret":
        role.metadata["torchstep"]["secret_env"]["T"] = value
    elif owner == "arg":
        role.args[1] = value
    elif owner == "env":
        role.env["A"] = value
    elif owner == "port":
        role.port_map["c10d"] = value
    elif owner == "keys":
        try:
            getattr(role, name)[value] = "x"
        except TypeError:  # unhashable: a key can only be hashable
            getattr(role, name)[repr(value)] = "x"


FIELD_PATHS = [
    *(f"app.{f.name}" for f in dataclasses.fields(AppDef)),
    *(f"role.{f.name}" for f in dataclasses.fields(Role)),
    *(f"resource.{f.name}" for f in dataclasses.fields(Resource)),
    "mount.src",
    "mount.dst_path",
    "mount.read_only",
    *(f"option.{k}" for k in ROLE_OPTIONS),
    "secret.T",
    "arg.1",
    "env.A",
    "port.c10d",
    "keys.env",
    "keys.port_map",
    "keys.metadata",
]


@BOUNDED
@given(path=st.sampled_from(FIELD_PATHS), value=ANY_VALUE, target=st.sampled_from(TARGETS))
def test_any_value_in_any_one_field(path: str, value: Any, target: str, missing_rows: Any) -> None:
    app = valid_app()
    set_path(app, path, value)
    plan = plan_or_spec_error(app, target)
    assert torchstep.explain(app, target).startswith("torchstep explain: ")
    if plan is not None:
        assert missing_rows(app, plan.decisions) == set()
        assert plan.roles[0].args == tuple(app.roles[0].args) and dict(plan.roles[0].env) == app.roles[0].env


# -- the deployment's policy (issue 24): any value anywhere is allowed or refused, never a crash
_STRICT = None


def _policies() -> list[Any]:
    from torchstep.policy import DEFAULT, Policy

    global _STRICT
    if _STRICT is None:
        _STRICT = Policy(
            images=("ghcr.io/acme/",),
            bind_mounts=("/data",),
            volume_mounts=("ckpt",),
            replicas=2,
            gpu=1,
            cpu=2,
            memMB=100,
            secrets=("s",),
            options=("labels",),
        )
    return [DEFAULT, _STRICT]


OVERLAY_SHAPES = [
    lambda v: v,
    lambda v: {"spec": v},
    lambda v: {"metadata": v},
    lambda v: {"containers": [v]},
    lambda v: {"initContainers": v},
    lambda v: {"containers": [{"name": "main", "securityContext": v}]},
    lambda v: {"containers": [{"name": "main", "env": [v]}]},
    lambda v: {"volumes": [v]},
    lambda v: {"volumes": [{"name": "p", "projected": {"sources": [v]}}]},
    lambda v: {"hostPID": v},
    lambda v: {"serviceAccountName": v},
    lambda v: {"imagePullSecrets": v},
]


@BOUNDED
@given(path=st.sampled_from(FIELD_PATHS), value=ANY_VALUE, target=st.sampled_from(["local", "kubernetes"]))
def test_the_policy_allows_or_refuses_any_value_in_any_field(path: str, value: Any, target: str) -> None:
    app = valid_app()
    set_path(app, path, value)
    for policy in _policies():
        try:
            problems = policy.problems(app, target, {})
        except SpecError:  # a value that is not even a value of its type: named, as by build_plan
            continue
        assert all(isinstance(p, SpecError) and p.field and p.fix for p in problems)


@BOUNDED
@given(
    shape=st.sampled_from(range(len(OVERLAY_SHAPES))),
    value=ANY_VALUE,
    cfg_value=ANY_VALUE,
    key=st.sampled_from(["namespace", "labels", "annotations", "log_dir", "inherit_env", "gpus", "nope"]),
)
def test_the_policy_walks_any_overlay_and_any_cfg_value_without_crashing(
    shape: int, value: Any, cfg_value: Any, key: str
) -> None:
    app = valid_app()
    app.roles[0].metadata["kubernetes"] = OVERLAY_SHAPES[shape](value)
    for target in ("local", "kubernetes"):
        for policy in _policies():
            try:
                policy.problems(app, target, {key: cfg_value})
            except SpecError:
                continue
