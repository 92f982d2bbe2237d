"""Every rendered object is valid (strict schema, both versions, API server rules) across a
matrix of AppDefs and run options."""

from __future__ import annotations

import pytest
import torchstep
from torchstep.kubernetes import render_plan
from torchstep.kubernetes.failure import needs_job
from torchx import specs

R = specs.RetryPolicy


def _apps(make_role) -> dict[str, specs.AppDef]:
    def app(*roles: specs.Role, **kw) -> specs.AppDef:
        return specs.AppDef(name=kw.pop("name", "train"), roles=list(roles), metadata=kw.pop("metadata", {}))

    ddp = lambda *a: torchstep.materialize("dist.ddp", list(a))  # noqa: E731
    return {
        "one-replica": app(make_role()),
        "many-replicas": app(make_role(num_replicas=4)),
        "elastic": app(make_role(num_replicas=4, min_replicas=2)),
        "several-roles": app(
            make_role(name="trainer", num_replicas=3),
            make_role(name="reader", num_replicas=1, resource=specs.Resource(cpu=1, gpu=0, memMB=512)),
            make_role(name="ps", num_replicas=2, resource=specs.Resource(cpu=0.5, gpu=0, memMB=256)),
        ),
        "no-resources": app(make_role(resource=specs.Resource(cpu=-1, gpu=-1, memMB=-1))),
        "every-resource": app(
            make_role(
                num_replicas=2,
                resource=specs.Resource(
                    cpu=7.5,
                    gpu=8,
                    memMB=1_000_000,
                    capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge", "kubernetes.io/arch": "amd64"},
                    devices={"vpc.amazonaws.com/efa": 4, "example.com/fpga": 1},
                ),
            )
        ),
        "every-mount": app(
            make_role(
                num_replicas=2,
                mounts=[
                    specs.BindMount(src_path="/mnt/data", dst_path="/data", read_only=True),
                    specs.BindMount(src_path="/var/cache", dst_path="/cache"),
                    specs.VolumeMount(src="checkpoints", dst_path="/ckpt"),
                    specs.VolumeMount(src="datasets.v2", dst_path="/datasets", read_only=True),
                    specs.DeviceMount(src_path="/dev/infiniband", dst_path="/dev/infiniband", permissions="rwm"),
                    specs.DeviceMount(src_path="/dev/fuse", dst_path="/dev/fuse", permissions="r"),
                ],
            )
        ),
        "shm-mounted": app(make_role(mounts=[specs.BindMount(src_path="/dev/shm", dst_path="/dev/shm")])),
        "replica-3": app(make_role(num_replicas=3, max_retries=3, retry_policy=R.REPLICA)),
        "replica-1": app(make_role(max_retries=2, retry_policy=R.REPLICA)),
        "hot-spare": app(make_role(num_replicas=4, min_replicas=3, max_retries=1, retry_policy=R.HOT_SPARE)),
        "application": app(make_role(num_replicas=2, max_retries=5, retry_policy=R.APPLICATION)),
        "role-policy": app(make_role(num_replicas=2, max_retries=2, retry_policy="ROLE")),
        "role-policy-1": app(make_role(max_retries=2, retry_policy="ROLE")),
        "ports": app(make_role(num_replicas=2, port_map={"tensorboard": 6006, "metrics": 9090})),
        "ports-1-replica": app(make_role(port_map={"tb": 6006})),
        "rdzv-port": app(make_role(num_replicas=2, port_map={"c10d": 29400})),
        "macros": app(
            make_role(
                num_replicas=2,
                args=["--out", "/ckpt/${app_id}/${replica_id}", "--host", "$${${rank0_env}}", "${img_root}/x"],
                env={"RUN": "${app_id}-r${replica_id}", "LITERAL": "$(HOME) $$x $"},
            )
        ),
        "secrets": app(
            make_role(
                num_replicas=2,
                metadata={"torchstep": {"secret_env": {"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "wandb/key"}}},
            )
        ),
        "overlay-spec": app(
            make_role(
                num_replicas=2,
                metadata={
                    "kubernetes": {
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                        "affinity": {
                            "nodeAffinity": {
                                "requiredDuringSchedulingIgnoredDuringExecution": {
                                    "nodeSelectorTerms": [
                                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
                                    ]
                                }
                            }
                        },
                        "nodeSelector": {"pool": "gpu"},
                        "volumes": [{"name": "cache", "emptyDir": {}}],
                        "containers": [{"name": "main", "volumeMounts": [{"name": "cache", "mountPath": "/cache"}]}],
                        "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"]}],
                        "schedulerName": "default-scheduler",
                    }
                },
            )
        ),
        "overlay-v1pod": app(
            make_role(
                metadata={
                    "kubernetes": {
                        "metadata": {"labels": {"team": "ml"}, "annotations": {"sidecar.istio.io/inject": "false"}},
                        "spec": {"runtimeClassName": "nvidia", "hostIPC": True},
                    }
                }
            )
        ),
        "timeouts": app(
            make_role(metadata={"torchstep": {"timeout": 1800, "grace_period": 45, "heartbeat_timeout": 120}}),
            metadata={"torchstep.timeout": "3600.5"},
        ),
        "ugly-names": app(make_role(name="Trainer_Main"), name="3D Vision_Train"),
        "long-names": app(
            make_role(name="r" * 60, num_replicas=2), make_role(name="r" * 59 + "x", num_replicas=2), name="a" * 90
        ),
        "ddp-1x1": ddp("--script", "train.py"),
        "ddp-2x4": ddp("-j", "2x4", "--script", "train.py", "--", "--lr", "0.1"),
        "ddp-elastic": ddp("-j", "1:3x2", "--script", "train.py", "--max_retries", "2"),
        "ddp-gpu": ddp(
            "-j",
            "2x8",
            "--gpu",
            "8",
            "--memMB",
            "65536",
            "--script",
            "train.py",
            "--mounts",
            "type=bind,src=/mnt,dst=/data",
        ),
    }


APP_NAMES = list(_apps(lambda **kw: specs.Role(name="x", image="x")))
CFGS = {
    "defaults": {},
    "everything": {
        "namespace": "ml-team",
        "service_account": "trainer",
        "image_pull_secrets": "regcred;mirror",
        "image_pull_policy": "IfNotPresent",
        "priority_class": "high-priority",
        "queue": "team-a",
        "labels": "team:ml;cost-center:42",
        "annotations": {"example.com/owner": "alice@example.com"},
        "ttl_seconds_after_finished": 3600,
        "active_deadline": 7200,
        "shm_size": "16Gi",
        "rdzv_port": 29501,
        "join_timeout": 1200,
        "cluster_domain": "k8s.example.internal",
        "result_file": "/airflow/xcom/return.json",
    },
    "jobs": {"pod": False},
    "pods": {"pod": True},
}


@pytest.fixture(scope="module")
def apps(role):
    return _apps(role)


# a bare Pod cannot carry ROLE retries: test_errors checks that SpecError
CASES = [(a, c) for a in APP_NAMES for c in CFGS if (a, c) != ("role-policy-1", "pods")]


@pytest.mark.parametrize(("app_name", "cfg_name"), CASES)
def test_every_object_is_valid(apps, app_name, cfg_name, check):
    plan = torchstep.build_plan(apps[app_name], "kubernetes")
    rendered = render_plan(plan, run_id=f"run-{app_name}", cfg=CFGS[cfg_name])
    objs = check(rendered)
    assert sum(o["kind"] in ("Job", "Pod") for o in objs) == len(plan.roles)
    for r in rendered.roles:
        if r.role.num_replicas > 1 or cfg_name == "jobs":
            assert r.kind == "Job"
        elif cfg_name == "pods":
            assert r.kind == "Pod"
        else:
            assert r.kind == ("Job" if needs_job(r.role) else "Pod")
