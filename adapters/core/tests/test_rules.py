"""Every translation rule on every target: honoured, ignored (a plan note) or rejected
with a SpecError naming the exact field, the target and the fix.

Each case changes one field of a valid AppDef, so on a target that rejects it the first
rejection is that field."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torchstep
from torchstep.plan.planner import plan_decisions
from torchx.specs import AppDef, BindMount, DeviceMount, Resource, RetryPolicy, Role, VolumeMount

TARGETS = ("local", "kubernetes", "kfp")
H, IG, R = "honoured", "ignored", "rejected"


def role(**kw: Any) -> Role:
    base: dict[str, Any] = dict(name="trainer", image="ghcr.io/acme/train:1", entrypoint="python", args=["train.py"])
    base.update(kw)
    return Role(**base)


def app(*roles: Role, **kw: Any) -> AppDef:
    return AppDef(kw.pop("name", "train"), list(roles) or [role()], **kw)


def res(**kw: Any) -> Resource:
    base: dict[str, Any] = dict(cpu=1, gpu=0, memMB=512)
    base.update(kw)
    return Resource(**base)


@dataclass
class Case:
    id: str
    build: Callable[[], AppDef]
    field: str
    # per target: (action, text the row — or for a rejection the fix — must contain)
    expect: dict[str, tuple[str, str]]


def same(action: str, text: str) -> dict[str, tuple[str, str]]:
    return {t: (action, text) for t in TARGETS}


def per(local: tuple[str, str], kubernetes: tuple[str, str], kfp: tuple[str, str]) -> dict[str, tuple[str, str]]:
    return {"local": local, "kubernetes": kubernetes, "kfp": kfp}


def md(**opts: Any) -> dict[str, Any]:
    return {"torchstep": opts}


def ddp_cmd(extra: str = "", nnodes: str = "2") -> list[str]:
    return ["-c", f"torchrun --nnodes {nnodes} --nproc_per_node 2 {extra} train.py".replace("  ", " ")]


CASES = [
    # ---- AppDef ---------------------------------------------------------------------------
    Case("app-name-empty", lambda: app(name=""), "name", same(R, "AppDef(name=")),
    Case("app-name-slash", lambda: app(name="a/b"), "name", same(R, "AppDef(name=")),
    Case(
        "app-name-non-ascii",
        lambda: app(name="模型"),
        "name",
        per((H, "app id 模型-<run id>"), (R, "ASCII letters"), (R, "ASCII letters")),
    ),
    Case(
        "app-name-k8s",
        lambda: app(name="Big_Train"),
        "name",
        per((H, "app id Big_Train"), (H, "'big-train' + run-unique suffix"), (H, "'big-train'")),
    ),
    Case(
        "app-timeout",
        lambda: app(metadata={"torchstep.timeout": "3600"}),
        "metadata['torchstep.timeout']",
        same(H, "step timeout 3600 s"),
    ),
    Case(
        "app-timeout-bad",
        lambda: app(metadata={"torchstep.timeout": "soon"}),
        "metadata['torchstep.timeout']",
        same(R, "3600"),
    ),
    Case(
        "app-option-typo",
        lambda: app(metadata={"torchstep.timout": "1"}),
        "metadata['torchstep.timout']",
        same(R, "torchstep.timeout"),
    ),
    Case("app-metadata-other", lambda: app(metadata={"owner": "ml"}), "metadata['owner']", same(IG, "informational")),
    Case("app-metadata-not-dict", lambda: app(metadata=None), "metadata", same(R, "torchstep.timeout")),
    Case("app-no-roles", lambda: AppDef("train", []), "roles", same(R, "torchx.specs.Role")),
    Case("app-role-not-role", lambda: AppDef("train", ["x"]), "roles[0]", same(R, "torchx.specs.Role")),
    Case(
        "roles-duplicate",
        lambda: app(role(), role()),
        "roles[1].name",
        same(R, "unique name"),
    ),
    Case(
        "roles-k8s-collision",
        lambda: app(role(name="a_b"), role(name="a-b")),
        "roles[1].name",
        per((H, "one agent process per replica"), (R, "rename one"), (R, "rename one")),
    ),
    # ---- Role identity and command ------------------------------------------------------------
    Case("role-name-space", lambda: app(role(name="my trainer")), "roles[0].name", same(R, "'trainer'")),
    Case("role-name-dot", lambda: app(role(name="..")), "roles[0].name", same(R, "'trainer'")),
    Case(
        "role-name-non-ascii",
        lambda: app(role(name="训练")),
        "roles[0].name",
        per((H, "logs under"), (R, "ASCII letters"), (R, "ASCII letters")),
    ),
    Case(
        "image-missing",
        lambda: app(role(image="")),
        "roles[0].image",
        per((IG, "not a directory"), (R, "registry/repo:tag"), (R, "registry/repo:tag")),
    ),
    Case(
        "image-ref",
        lambda: app(role()),
        "roles[0].image",
        per((IG, "this machine's environment"), (H, "container image"), (H, "ContainerSpec image")),
    ),
    Case("base-image", lambda: app(role(base_image="old:1")), "roles[0].base_image", same(IG, "deprecated")),
    Case(
        "entrypoint-missing", lambda: app(role(entrypoint="<MISSING>")), "roles[0].entrypoint", same(R, "entrypoint=")
    ),
    Case(
        "entrypoint",
        lambda: app(role()),
        "roles[0].entrypoint",
        per((H, "argv[0]"), (H, "command = torchstep-agent"), (H, "torchstep_kfp.entry")),
    ),
    Case("args", lambda: app(role(args=["a; rm -rf /", "$x"])), "roles[0].args", same(H, "byte for byte")),
    Case("args-not-str", lambda: app(role(args=["--n", 3])), "roles[0].args[1]", same(R, "str()")),
    Case("args-nul", lambda: app(role(args=["a\x00b"])), "roles[0].args[0]", same(R, "remove")),
    Case("args-not-list", lambda: app(role(args="--lr 0.1")), "roles[0].args", same(R, "['--lr', '0.1']")),
    Case("env-none", lambda: app(role()), "roles[0].env", same(H, "none")),
    Case(
        "env",
        lambda: app(role(env={"A": "1"})),
        "roles[0].env",
        per((H, "merged over"), (H, "container env"), (H, "set_env_variable")),
    ),
    Case("env-bad-name", lambda: app(role(env={"1BAD": "x"})), "roles[0].env['1BAD']", same(R, "[A-Za-z_]")),
    Case("env-not-str", lambda: app(role(env={"A": 1})), "roles[0].env['A']", same(R, "str()")),
    # ---- replicas -----------------------------------------------------------------------------
    Case("replicas-zero", lambda: app(role(num_replicas=0)), "roles[0].num_replicas", same(R, "num_replicas=N")),
    Case(
        "min-gt-num",
        lambda: app(role(num_replicas=2, min_replicas=3)),
        "roles[0].min_replicas",
        same(R, "min_replicas <= num_replicas"),
    ),
    Case(
        "replicas-elastic",
        lambda: app(role(num_replicas=4, min_replicas=2)),
        "roles[0].num_replicas",
        per((H, "--nnodes 2:4"), (H, "Indexed Job"), (H, "launcher step submitting an Indexed Job of 4")),
    ),
    Case("min-unset", lambda: app(role()), "roles[0].min_replicas", same(H, "not elastic")),
    # ---- resource -----------------------------------------------------------------------------
    Case(
        "cpu",
        lambda: app(role(resource=res(cpu=2.5))),
        "roles[0].resource.cpu",
        per((H, "OMP_NUM_THREADS"), (H, "requests.cpu = limits.cpu = 2.5"), (H, "set_cpu_request/limit('2.5')")),
    ),
    Case("cpu-unset", lambda: app(role(resource=res(cpu=-1))), "roles[0].resource.cpu", same(H, "unset")),
    Case("cpu-negative", lambda: app(role(resource=res(cpu=-2))), "roles[0].resource.cpu", same(R, "-1")),
    Case("cpu-huge", lambda: app(role(resource=res(cpu=10**6))), "roles[0].resource.cpu", same(R, "unit")),
    Case("cpu-nan", lambda: app(role(resource=res(cpu=float("nan")))), "roles[0].resource.cpu", same(R, "e.g. 2")),
    Case("cpu-str", lambda: app(role(resource=res(cpu="2"))), "roles[0].resource.cpu", same(R, "e.g. 2")),
    Case(
        "gpu",
        lambda: app(role(resource=res(gpu=2))),
        "roles[0].resource.gpu",
        per((H, "CUDA_VISIBLE_DEVICES"), (H, "nvidia.com/gpu: 2"), (H, "set_accelerator_limit(2)")),
    ),
    Case("gpu-float", lambda: app(role(resource=res(gpu=1.5))), "roles[0].resource.gpu", same(R, "e.g. 2")),
    Case(
        "mem",
        lambda: app(role(resource=res(memMB=4096))),
        "roles[0].resource.memMB",
        per((IG, "advisory"), (H, "4096Mi"), (H, "set_memory_request/limit('4096Mi')")),
    ),
    Case("mem-bytes", lambda: app(role(resource=res(memMB=2**50))), "roles[0].resource.memMB", same(R, "MiB")),
    Case(
        "devices",
        lambda: app(role(resource=res(devices={"vpc.amazonaws.com/efa": 4}))),
        "roles[0].resource.devices['vpc.amazonaws.com/efa']",
        per((IG, "node hardware"), (H, "extended resource"), (R, "target kubernetes")),
    ),
    Case(
        "devices-bad-name",
        lambda: app(role(resource=res(devices={"efa": 1}))),
        "roles[0].resource.devices['efa']",
        same(R, "vpc.amazonaws.com/efa"),
    ),
    Case(
        "devices-bad-count",
        lambda: app(role(resource=res(devices={"x.com/y": -1}))),
        "roles[0].resource.devices['x.com/y']",
        same(R, "e.g. 1"),
    ),
    Case(
        "capability",
        lambda: app(role(resource=res(capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"}))),
        "roles[0].resource.capabilities['node.kubernetes.io/instance-type']",
        per((IG, "one machine"), (H, "nodeSelector"), (H, "add_node_selector")),
    ),
    Case(
        "capability-unknown",
        lambda: app(role(resource=res(capabilities={"gpu_type": "a100"}))),
        "roles[0].resource.capabilities['gpu_type']",
        same(R, "role.metadata['kubernetes']"),
    ),
    Case(
        "capability-not-str",
        lambda: app(role(resource=res(capabilities={"kubernetes.io/arch": 64}))),
        "roles[0].resource.capabilities['kubernetes.io/arch']",
        same(R, "p4d.24xlarge"),
    ),
    Case("resource-not-resource", lambda: app(role(resource=None)), "roles[0].resource", same(R, "Resource(")),
    # ---- mounts -------------------------------------------------------------------------------
    Case("mounts-none", lambda: app(role()), "roles[0].mounts", same(H, "no mounts")),
    Case(
        "bind-same-path",
        lambda: app(role(mounts=[BindMount("/data", "/data")])),
        "roles[0].mounts[0]",
        per((H, "in place"), (H, "hostPath volume /data"), (R, "VolumeMount")),
    ),
    Case(
        "bind-rewrite-ro",
        lambda: app(role(mounts=[BindMount("/mnt/ds", "/data", read_only=True)])),
        "roles[0].mounts[0]",
        per((H, "rewritten to /mnt/ds"), (H, "(readOnly)"), (R, "VolumeMount")),
    ),
    Case(
        "bind-relative-src",
        lambda: app(role(mounts=[BindMount("data", "/data")])),
        "roles[0].mounts[0].src_path",
        {"local": (R, "absolute host path"), "kubernetes": (R, "absolute host path")},
    ),
    Case(
        "volume",
        lambda: app(role(mounts=[VolumeMount("ckpt", "/ckpt")])),
        "roles[0].mounts[0]",
        per((R, "BindMount"), (H, "persistentVolumeClaim ckpt"), (H, "mount_pvc")),
    ),
    Case(
        "volume-read-only",
        lambda: app(role(mounts=[VolumeMount("ckpt", "/ckpt", read_only=True)])),
        "roles[0].mounts[0].read_only",
        {"kfp": (R, "read_only=False")},
    ),
    Case(
        "volume-bad-claim",
        lambda: app(role(mounts=[VolumeMount("My_Claim", "/ckpt")])),
        "roles[0].mounts[0].src",
        {"kubernetes": (R, "claim's name"), "kfp": (R, "claim's name")},
    ),
    Case(
        "device",
        lambda: app(role(mounts=[DeviceMount("/dev/fuse", "/dev/fuse")])),
        "roles[0].mounts[0]",
        per((H, "device is used in place"), (H, "privileged"), (R, "VolumeMount")),
    ),
    Case(
        "device-perms",
        lambda: app(role(mounts=[DeviceMount("/dev/fuse", "/dev/fuse", permissions="rx")])),
        "roles[0].mounts[0].permissions",
        same(R, "'rwm'"),
    ),
    Case(
        "mount-relative-dst",
        lambda: app(role(mounts=[BindMount("/data", "data")])),
        "roles[0].mounts[0].dst_path",
        same(R, "/data"),
    ),
    Case(
        "mount-dup-dst",
        lambda: app(role(mounts=[VolumeMount("a", "/d"), VolumeMount("b", "/d")])),
        "roles[0].mounts[1].dst_path",
        {"kubernetes": (R, "each path once"), "kfp": (R, "each path once")},
    ),
    Case(
        "bind-onto-root",
        lambda: app(role(mounts=[BindMount("/mnt/root", "/")])),
        "roles[0].mounts[0].dst_path",
        {"local": (R, "subdirectory")},
    ),
    Case("mount-unknown", lambda: app(role(mounts=["type=bind"])), "roles[0].mounts[0]", same(R, "parse_mounts")),
    # ---- ports --------------------------------------------------------------------------------
    Case("ports-none", lambda: app(role()), "roles[0].port_map", same(H, "no ports")),
    Case(
        "port-rdzv",
        lambda: app(role(port_map={"c10d": 29500})),
        "roles[0].port_map['c10d']",
        per((H, "supervisor's store port"), (H, "containerPort 29500"), (H, "rendezvous port")),
    ),
    Case(
        "port-other",
        lambda: app(role(port_map={"tb": 6006})),
        "roles[0].port_map['tb']",
        per((H, "port 6006 + replica id on this machine"), (H, "containerPort 6006"), (R, "target kubernetes")),
    ),
    Case("port-range", lambda: app(role(port_map={"tb": 70000})), "roles[0].port_map['tb']", same(R, "6006")),
    Case(
        "port-k8s-name",
        lambda: app(role(port_map={"tensor_board": 6006})),
        "roles[0].port_map['tensor_board']",
        per((H, "TORCHSTEP_PORT_TENSOR_BOARD"), (R, "rename it"), (R, "rename it")),
    ),
    Case(
        "port-env-collision",
        lambda: app(role(port_map={"a-b": 1000, "a.b": 1001})),
        "roles[0].port_map['a.b']",
        {"local": (R, "differ in letters")},
    ),
    Case(
        "port-duplicate-number",
        lambda: app(role(port_map={"c10d": 80, "rdzv": 80})),
        "roles[0].port_map['rdzv']",
        same(R, "each port once"),
    ),
    # ---- retries ------------------------------------------------------------------------------
    Case("retries-negative", lambda: app(role(max_retries=-1)), "roles[0].max_retries", same(R, "e.g. 2")),
    Case("retries-str", lambda: app(role(max_retries="3")), "roles[0].max_retries", same(R, "e.g. 2")),
    Case(
        "policy-unknown",
        lambda: app(role(retry_policy="ALWAYS")),
        "roles[0].retry_policy",
        same(R, "APPLICATION, REPLICA, HOT_SPARE, ROLE"),
    ),
    Case("policy-unhashable", lambda: app(role(retry_policy=["REPLICA"])), "roles[0].retry_policy", same(R, "REPLICA")),
    Case(
        "policy-application",
        lambda: app(role(max_retries=2)),
        "roles[0].retry_policy",
        per((H, "2 retries of the whole app"), (H, "backoffLimit 0"), (H, "set_retry(2)")),
    ),
    Case(
        "policy-replica",
        lambda: app(role(max_retries=2, retry_policy=RetryPolicy.REPLICA)),
        "roles[0].retry_policy",
        per((H, "--max-restarts 2"), (H, "podFailurePolicy"), (H, "no set_retry")),
    ),
    Case(
        "policy-role-by-name",
        lambda: app(role(max_retries=2, retry_policy="ROLE")),
        "roles[0].retry_policy",
        per((H, "every replica of the role"), (H, "backoffLimit 2"), (H, "launcher step")),
    ),
    Case(
        "layers-multiply",
        lambda: app(role(max_retries=1), role(name="ps", max_retries=1, retry_policy=RetryPolicy.REPLICA)),
        "roles[1].retry_policy",
        same(R, "one retry policy for every role"),
    ),
    # ---- role.metadata --------------------------------------------------------------------------
    Case("metadata-none", lambda: app(role()), "roles[0].metadata", same(H, "none")),
    Case("metadata-not-dict", lambda: app(role(metadata=None)), "roles[0].metadata", same(R, "metadata={")),
    Case(
        "metadata-other-tool",
        lambda: app(role(metadata={"mlflow": {"run": "1"}})),
        "roles[0].metadata['mlflow']",
        same(IG, "other tools"),
    ),
    Case(
        "metadata-kubernetes",
        lambda: app(role(metadata={"kubernetes": {"tolerations": []}})),
        "roles[0].metadata['kubernetes']",
        per((IG, "one machine"), (H, "pod spec"), (H, "kfp-kubernetes")),
    ),
    Case(
        "metadata-kubernetes-not-dict",
        lambda: app(role(metadata={"kubernetes": "yes"})),
        "roles[0].metadata['kubernetes']",
        same(R, "nodeSelector"),
    ),
    Case(
        "option-typo",
        lambda: app(role(metadata=md(timout=5))),
        "roles[0].metadata['torchstep']['timout']",
        same(R, "timeout"),
    ),
    Case(
        "option-not-dict",
        lambda: app(role(metadata={"torchstep": ["timeout"]})),
        "roles[0].metadata['torchstep']",
        same(R, "nproc_per_node"),
    ),
    Case(
        "option-timeout",
        lambda: app(role(metadata=md(timeout=600))),
        "roles[0].metadata['torchstep']['timeout']",
        same(H, "role timeout 600 s"),
    ),
    Case(
        "option-timeout-bool",
        lambda: app(role(metadata=md(timeout=True))),
        "roles[0].metadata['torchstep']['timeout']",
        same(R, "3600"),
    ),
    Case(
        "option-nproc",
        lambda: app(role(metadata=md(nproc_per_node=4))),
        "roles[0].metadata['torchstep']['nproc_per_node']",
        same(H, "agent --nproc-per-node 4"),
    ),
    Case(
        "option-nproc-zero",
        lambda: app(role(metadata=md(nproc_per_node=0))),
        "roles[0].metadata['torchstep']['nproc_per_node']",
        same(R, "e.g. 2"),
    ),
    Case(
        "option-heartbeat",
        lambda: app(role(metadata=md(heartbeat_timeout=60, grace_period=5))),
        "roles[0].metadata['torchstep']['heartbeat_timeout']",
        same(H, "--heartbeat-timeout 60"),
    ),
    Case(
        "option-retry-delay-application",
        lambda: app(role(max_retries=2, metadata=md(retry_delay=30))),
        "roles[0].metadata['torchstep']['retry_delay']",
        per((H, "caller's retries"), (H, "retry delay 30 s"), (H, "backoff_duration")),
    ),
    Case(
        "option-retry-delay-replica",
        lambda: app(role(max_retries=2, retry_policy=RetryPolicy.REPLICA, metadata=md(retry_delay=30))),
        "roles[0].metadata['torchstep']['retry_delay']",
        same(IG, "owned by: agent"),
    ),
    Case(
        "option-retry-backoff-bad",
        lambda: app(role(metadata=md(retry_backoff=0.5))),
        "roles[0].metadata['torchstep']['retry_backoff']",
        same(R, "2.0"),
    ),
    Case(
        "secret",
        lambda: app(role(metadata=md(secret_env={"HF_TOKEN": "hf-token/token"}))),
        "roles[0].metadata['torchstep']['secret_env']['HF_TOKEN']",
        per((H, "checked at launch"), (H, "secretKeyRef"), (H, "use_secret_as_env")),
    ),
    Case(
        "secret-bad-ref",
        lambda: app(role(metadata=md(secret_env={"HF_TOKEN": "hf_token"}))),
        "roles[0].metadata['torchstep']['secret_env']['HF_TOKEN']",
        same(R, "'hf-token/token'"),
    ),
    Case(
        "secret-also-in-env",
        lambda: app(role(env={"HF_TOKEN": "x"}, metadata=md(secret_env={"HF_TOKEN": "hf/token"}))),
        "roles[0].metadata['torchstep']['secret_env']['HF_TOKEN']",
        same(R, "one place"),
    ),
    Case(
        "secret-not-dict",
        lambda: app(role(metadata=md(secret_env="hf/token"))),
        "roles[0].metadata['torchstep']['secret_env']",
        same(R, "HF_TOKEN"),
    ),
    # ---- a role's own torchrun ------------------------------------------------------------------
    Case(
        "torchrun",
        lambda: app(role(entrypoint="bash", args=ddp_cmd(), num_replicas=2)),
        "roles[0].entrypoint+args",
        same(H, "own torchrun runs as torchstep-agent"),
    ),
    Case(
        "torchrun-nnodes-mismatch",
        lambda: app(role(entrypoint="bash", args=ddp_cmd(nnodes="4"), num_replicas=2)),
        "roles[0].args",
        same(R, "--nnodes 2"),
    ),
    Case(
        "torchrun-nproc-conflict",
        lambda: app(role(entrypoint="bash", args=ddp_cmd(), num_replicas=2, metadata=md(nproc_per_node=4))),
        "roles[0].metadata['torchstep']['nproc_per_node']",
        same(R, "one place"),
    ),
    Case(
        "torchrun-heartbeat-env",
        lambda: app(role(entrypoint="torchrun", args=["train.py"], metadata=md(heartbeat_timeout=60))),
        "roles[0].metadata['torchstep']['heartbeat_timeout']",
        same(H, "TORCHSTEP_HEARTBEAT_TIMEOUT=60"),
    ),
    Case(
        "torchrun-restarts-with-application",
        lambda: app(role(entrypoint="bash", args=ddp_cmd("--max-restarts 3"), num_replicas=2, max_retries=1)),
        "roles[0].args",
        same(R, "RetryPolicy.REPLICA with max_retries=3"),
    ),
    Case(
        "torchrun-restarts-disagree",
        lambda: app(
            role(
                entrypoint="bash",
                args=ddp_cmd("--max_restarts=1"),
                num_replicas=2,
                max_retries=3,
                retry_policy=RetryPolicy.REPLICA,
            )
        ),
        "roles[0].args",
        same(R, "one place"),
    ),
    Case(
        "torchrun-restarts-agent",
        lambda: app(role(entrypoint="torchrun", args=["t.py"], max_retries=3, retry_policy=RetryPolicy.REPLICA)),
        "roles[0].retry_policy",
        same(H, "PET_MAX_RESTARTS=3"),
    ),
    Case(
        "torchrun-restarts-only-layer",
        lambda: app(role(entrypoint="torchrun", args=["--max-restarts", "2", "t.py"])),
        "roles[0].args",
        same(H, "its only retry layer"),
    ),
    # ---- macros -------------------------------------------------------------------------------
    Case(
        "macros",
        lambda: app(role(args=["--id", "${app_id}", "--rank", "$replica_id"])),
        "roles[0].macros",
        per((H, "0..N-1 per agent"), (H, "JOB_COMPLETION_INDEX"), (H, "Job index")),
    ),
]


PAIRS = [pytest.param(c, t, id=f"{c.id}-{t}") for c in CASES for t in TARGETS if t in c.expect]


@pytest.mark.parametrize(("case", "target"), PAIRS)
def test_rule(case: Case, target: str) -> None:
    action, text = case.expect[target]
    the_app = case.build()
    rows = [d for d in plan_decisions(the_app, target) if d.field == case.field]
    assert rows, f"no decision for {case.field} on {target}: the field would be dropped silently"
    d = rows[-1] if action != R else next((r for r in rows if r.action == R), rows[-1])
    assert d.action == action, f"{case.field} on {target}: {d}"
    if action == R:
        assert d.fix and text in d.fix, d
        with pytest.raises(torchstep.SpecError) as err:
            torchstep.build_plan(the_app, target)
        e = err.value
        assert isinstance(e, ValueError)
        assert (e.field, e.target) == (case.field, target), str(e)
        assert e.fix and text in e.fix and text in str(e)
        return
    assert text in d.becomes, d
    plan = torchstep.build_plan(the_app, target)
    notes = {n.field for n in plan.notes}
    assert (case.field in notes) == (action == IG), f"{case.field} on {target}: notes {notes}"


def test_unknown_target() -> None:
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan(app(), "gke")
    assert err.value.field == "target" and "local, kubernetes, kfp" in (err.value.fix or "")


def test_not_an_appdef() -> None:
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan({"name": "x"}, "local")
    assert err.value.field == "app" and "materialize" in (err.value.fix or "")


# ---- what the plan holds for honoured fields ------------------------------------------------
def test_plan_values_on_kubernetes() -> None:
    r = role(
        num_replicas=4,
        min_replicas=2,
        env={"A": "1"},
        resource=res(
            cpu=8,
            gpu=2,
            memMB=32768,
            devices={"vpc.amazonaws.com/efa": 4},
            capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
        ),
        port_map={"c10d": 29500, "tb": 6006},
        mounts=[BindMount("/mnt/ds", "/data", read_only=True), VolumeMount("ckpt", "/ckpt")],
        max_retries=3,
        retry_policy=RetryPolicy.REPLICA,
        metadata=md(
            nproc_per_node=2,
            timeout=7200,
            heartbeat_timeout=120,
            grace_period=10,
            secret_env={"HF_TOKEN": "hf-token/token"},
        ),
    )
    plan = torchstep.build_plan(app(r, metadata={"torchstep.timeout": "86400"}), "kubernetes")
    rp = plan.roles[0]
    assert (plan.app_name, plan.k8s_name, plan.timeout_s) == ("train", "train", 86400.0)
    assert (rp.min_replicas, rp.num_replicas, rp.nnodes, rp.elastic, rp.nproc_per_node) == (2, 4, "2:4", True, 2)
    assert rp.resources == torchstep.plan.model.Resources(
        cpu=8,
        gpu=2,
        mem_mb=32768,
        devices={"vpc.amazonaws.com/efa": 4},
        capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
    )
    assert [(m.kind, m.src, m.dst, m.read_only) for m in rp.mounts] == [
        ("bind", "/mnt/ds", "/data", True),
        ("volume", "ckpt", "/ckpt", False),
    ]
    assert [(p.name, p.port) for p in rp.ports] == [("c10d", 29500), ("tb", 6006)]
    assert (rp.retry.owner.value, rp.retry.agent_restarts, plan.orchestrator_retries) == ("agent", 3, 0)
    assert (rp.timeout_s, rp.heartbeat_timeout_s, rp.grace_period_s) == (7200.0, 120.0, 10.0)
    assert rp.secret_env == (torchstep.plan.model.SecretRef("HF_TOKEN", "hf-token", "token"),)
    assert rp.env == {"A": "1"} and "HF_TOKEN" not in rp.env  # a secret never by value
    assert plan.notes == ()


def test_plan_is_deterministic_and_has_no_run_suffix() -> None:
    a = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    plans = [torchstep.build_plan(a, "kubernetes") for _ in range(2)]
    assert plans[0] == plans[1]
    assert plans[0].k8s_name == "train" and plans[0].roles[0].k8s_name == "train"


def test_local_directory_image_is_the_working_directory(tmp_path: Any) -> None:
    plan = torchstep.build_plan(app(role(image=str(tmp_path))), "local")
    assert plan.roles[0].workdir == str(tmp_path)
    assert plan.notes == ()


def test_local_secret_is_read_at_launch_not_at_planning() -> None:
    r = role(metadata=md(secret_env={"TS_TEST_SECRET": "s/k"}))
    plan = torchstep.build_plan(app(r), "local")  # the variable is not set here: still plannable
    rp = plan.roles[0]
    assert rp.secret_values({"TS_TEST_SECRET": "v", "OTHER": "x"}) == {"TS_TEST_SECRET": "v"}
    with pytest.raises(torchstep.SpecError) as err:
        rp.secret_values({})
    assert err.value.field == "roles[0].metadata['torchstep']['secret_env']['TS_TEST_SECRET']"
    assert err.value.target == "local" and "export TS_TEST_SECRET" in (err.value.fix or "")


def test_every_field_is_rejected_at_once_by_explain() -> None:
    bad = app(
        role(image="", resource=res(cpu=-5), mounts=[BindMount("/a", "/b")], port_map={"tb": 1}),
        metadata={"torchstep.x": "1"},
    )
    rejected = {d.field for d in plan_decisions(bad, "kfp") if d.action == R}
    assert rejected == {
        "metadata['torchstep.x']",
        "roles[0].image",
        "roles[0].resource.cpu",
        "roles[0].mounts[0]",
        "roles[0].port_map['tb']",
    }
    assert torchstep.explain(bad, "kfp").splitlines()[0].endswith("5 field(s) rejected")


# ---- nothing dropped silently: every dataclass field has a row --------------------------------
@dataclasses.dataclass
class NightlyResource(Resource):
    tags: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class NightlyRole(Role):
    workspace: Any = None
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    added_next_year: Any = None


@pytest.mark.parametrize("target", TARGETS)
def test_every_field_of_every_dataclass_has_a_row(target: str, missing_rows: Any) -> None:
    plain = app(role(), role(name="ps", resource=res(cpu=-1, gpu=-1, memMB=-1)))
    nightly = app(NightlyRole("t", image="img", entrypoint="python", resource=NightlyResource(cpu=1, gpu=0, memMB=1)))
    ddp = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    rich = app(
        role(
            env={"A": "1"},
            resource=res(devices={"vpc.amazonaws.com/efa": 1}, capabilities={"kubernetes.io/arch": "amd64"}),
            port_map={"c10d": 29500},
            mounts=[VolumeMount("ckpt", "/ckpt")],
            metadata={
                "torchstep": {"timeout": 5, "grace_period": 3, "retry_delay": 1, "secret_env": {"T": "s/k"}},
                "kubernetes": {},
                "other": 1,
            },
        ),
        metadata={"torchstep.timeout": "60", "owner": "me"},
    )
    for a in (plain, nightly, ddp, rich):
        assert missing_rows(a, plan_decisions(a, target)) == set()


@pytest.mark.parametrize("target", TARGETS)
def test_nightly_only_fields_by_name(target: str) -> None:
    def nightly(**kw: Any) -> AppDef:
        r = NightlyRole("t", image="img", entrypoint="python", resource=NightlyResource(cpu=1, gpu=0, memMB=1))
        for k, v in kw.items():
            setattr(r.resource if k == "tags" else r, k, v)
        return app(r)

    ok = torchstep.build_plan(nightly(), target)
    local_only = {"roles[0].image", "roles[0].resource.memMB"} if target == "local" else set()
    assert {n.field for n in ok.notes} == {"roles[0].added_next_year", *local_only}  # unset: noted
    tagged = torchstep.build_plan(nightly(tags={"team": "ml"}), target)
    assert "roles[0].resource.tags" in {n.field for n in tagged.notes}
    for field, value, fix in (
        ("workspace", {"projects": {".": "app"}}, "bake the code into the image"),
        ("overrides", {"limits": 1}, "role.metadata['kubernetes']"),
        ("added_next_year", 42, "upgrade torchstep"),
    ):
        with pytest.raises(torchstep.SpecError) as err:
            torchstep.build_plan(nightly(**{field: value}), target)
        assert err.value.field == f"roles[0].{field}" and fix in (err.value.fix or "")
