"""Golden tests on the fields that matter: names and DNS, command, env, resources, volumes,
retry settings. Written out in full so a change shows up as a readable diff."""

from __future__ import annotations

import pytest
import torchstep
from torchstep.kubernetes import render_plan
from torchx import specs

INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
NAME = "train-trainer-4e65d3fb"  # <app>-<role>-<hash of run id "run-1">
FQDN = f"{NAME}-0.{NAME}.ml.svc.cluster.local"


@pytest.fixture(scope="module")
def rendered(role):
    trainer = role(
        args=["-m", "acme.train", "--out", "/ckpt/${app_id}/${replica_id}"],
        env={"RUN": "r${replica_id}"},
        num_replicas=2,
        max_retries=3,
        retry_policy=specs.RetryPolicy.REPLICA,
        resource=specs.Resource(
            cpu=7.5,
            gpu=8,
            memMB=65536,
            capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"},
            devices={"vpc.amazonaws.com/efa": 4},
        ),
        port_map={"tb": 6006},
        mounts=[
            specs.BindMount("/mnt/data", "/data", True),
            specs.VolumeMount("ckpt", "/ckpt"),
            specs.DeviceMount("/dev/infiniband", "/dev/infiniband", "rwm"),
        ],
        metadata={"torchstep": {"secret_env": {"HF_TOKEN": "hf-token/token"}}},
    )
    evaluator = role(name="eval", args=["eval.py", "--replica", "${replica_id}"], resource=specs.Resource(0.25, 0, 512))
    plan = torchstep.build_plan(specs.AppDef("train", [trainer, evaluator]), "kubernetes")
    return render_plan(plan, namespace="ml", run_id="run-1")


def test_names_labels_and_dns(rendered):
    trainer, evaluator = rendered.roles
    assert rendered.app_id == "train-4e65d3fb"
    assert rendered.label_selector == "torchstep/app-id=train-4e65d3fb"
    assert (trainer.name, trainer.kind, evaluator.name, evaluator.kind) == (NAME, "Job", "train-eval-4e65d3fb", "Pod")
    assert trainer.rank0_host == FQDN and trainer.rdzv_endpoint == f"{FQDN}:29500"
    assert (evaluator.rank0_host, evaluator.rdzv_endpoint) == ("localhost", "localhost:29500")
    assert trainer.labels == {
        "app.kubernetes.io/managed-by": "torchstep",
        "app.kubernetes.io/name": "train",
        "torchstep/app-id": "train-4e65d3fb",
        "torchstep/role": "trainer",
    }
    assert trainer.workload["metadata"]["annotations"] == {
        "torchstep/app-name": "train",
        "torchstep/role-name": "trainer",
    }
    assert [(o["kind"], o["metadata"]["name"]) for o in rendered.objects] == [
        ("Service", NAME),
        ("NetworkPolicy", NAME),
        ("Job", NAME),
        ("Pod", "train-eval-4e65d3fb"),
    ]


def test_headless_service(rendered):
    assert rendered.roles[0].service["spec"] == {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": {"torchstep/app-id": "train-4e65d3fb", "torchstep/role": "trainer"},
        "ports": [
            {"name": "tb", "port": 6006, "targetPort": 6006, "protocol": "TCP"},
            {"name": "c10d", "port": 29500, "targetPort": 29500, "protocol": "TCP"},
        ],
    }
    assert rendered.roles[1].service is None


def test_network_policy(rendered):
    """The stores answer the run's own pods only; the declared port (tb) stays open to all."""
    trainer, evaluator = rendered.roles
    policy = trainer.network_policy
    assert policy["metadata"]["labels"] == trainer.labels
    assert policy["spec"] == {
        "podSelector": {"matchLabels": {"torchstep/app-id": "train-4e65d3fb", "torchstep/role": "trainer"}},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": {"torchstep/app-id": "train-4e65d3fb"}}}]},
            {"ports": [{"port": 6006, "protocol": "TCP"}]},
        ],
    }
    assert evaluator.network_policy is None  # one replica: its stores listen on loopback only


def test_replica_retry_settings(rendered):
    spec = rendered.roles[0].workload["spec"]
    assert {k: v for k, v in spec.items() if k != "template"} == {
        "completionMode": "Indexed",
        "completions": 2,
        "parallelism": 2,
        "backoffLimitPerIndex": 3,
        "maxFailedIndexes": 0,
        "podFailurePolicy": {
            "rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [82]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                {
                    "action": "Count",
                    "onExitCodes": {"containerName": "main", "operator": "In", "values": [83, 137, 143]},
                },
                {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "NotIn", "values": [0]}},
            ]
        },
        "podReplacementPolicy": "Failed",
    }
    assert "--max-restarts" in (args := spec["template"]["spec"]["containers"][0]["args"])
    assert args[args.index("--max-restarts") + 1] == "3"


def test_command_wraps_the_role_argv(rendered):
    c = rendered.roles[0].workload["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["torchstep-agent"]
    assert c["args"] == [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--role",
        "trainer",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{FQDN}:29500",
        "--rdzv-id",
        NAME,
        "--rdzv-conf",
        "join_timeout=900",
        "--no-python",
        "python",
        "-m",
        "acme.train",
        "--out",
        "/ckpt/train-4e65d3fb/$(TORCHSTEP_REPLICA_ID)",
    ]
    single = rendered.roles[1].pod["spec"]["containers"][0]
    assert single["args"][-5:] == ["--no-python", "python", "eval.py", "--replica", "0"]


def test_env_secrets_by_reference(rendered):
    env = rendered.roles[0].workload["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [
        {"name": "TORCHSTEP_REPLICA_ID", "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}},
        {"name": "RUN", "value": "r$(TORCHSTEP_REPLICA_ID)"},
        {"name": "TORCHSTEP_APP_ID", "value": "train-4e65d3fb"},
        {"name": "TORCHSTEP_ROLE", "value": "trainer"},
        {"name": "TORCHX_RANK0_HOST", "value": FQDN},
        {"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"},
        {"name": "TORCHSTEP_RDZV_ENDPOINT", "value": f"{FQDN}:29500"},
        {"name": "TORCHSTEP_RDZV_ID", "value": NAME},
        {"name": "TORCHSTEP_RDZV_CONF", "value": "join_timeout=900"},
        # the agent's final result summary becomes the container's termination message
        {"name": "TORCHSTEP_TERMINATION_LOG", "value": "/dev/termination-log"},
        # where the agent says "the gang formed" (the readinessProbe checks it)
        {"name": "TORCHSTEP_READY_FILE", "value": "/dev/shm/torchstep-ready"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}},
    ]
    single_env = rendered.roles[1].pod["spec"]["containers"][0]["env"]
    assert single_env[0] == {"name": "TORCHSTEP_REPLICA_ID", "value": "0"}
    assert "TORCHSTEP_READY_FILE" not in {e["name"] for e in single_env}  # one replica: no gang to form


def test_resources_and_node_selection(rendered):
    spec = rendered.roles[0].workload["spec"]["template"]["spec"]
    amounts = {"cpu": "7500m", "memory": "65536Mi", "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "4"}
    assert spec["containers"][0]["resources"] == {"requests": amounts, "limits": amounts}
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    small = rendered.roles[1].pod["spec"]["containers"][0]["resources"]
    assert small == {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"cpu": "250m", "memory": "512Mi"}}


def test_volumes_and_device_access(rendered):
    spec = rendered.roles[0].workload["spec"]["template"]["spec"]
    assert spec["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "mount-0", "hostPath": {"path": "/mnt/data"}},
        {"name": "mount-1", "persistentVolumeClaim": {"claimName": "ckpt"}},
        {"name": "mount-2", "hostPath": {"path": "/dev/infiniband"}},
    ]
    c = spec["containers"][0]
    assert c["volumeMounts"] == [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "mount-0", "mountPath": "/data", "readOnly": True},
        {"name": "mount-1", "mountPath": "/ckpt"},
        {"name": "mount-2", "mountPath": "/dev/infiniband"},
    ]
    assert c["securityContext"] == {"privileged": True}
    assert "securityContext" not in rendered.roles[1].pod["spec"]["containers"][0]


def test_pod_of_one_replica(rendered):
    pod = rendered.roles[1].pod
    assert pod["metadata"]["name"] == "train-eval-4e65d3fb" and pod["metadata"]["namespace"] == "ml"
    assert pod["spec"]["restartPolicy"] == "Never" and "subdomain" not in pod["spec"]
    assert pod == rendered.roles[1].workload


def test_application_and_role_policies(role):
    def job_spec(policy, retries, replicas=3):
        plan = torchstep.build_plan(
            specs.AppDef("a", [role(num_replicas=replicas, max_retries=retries, retry_policy=policy)]), "kubernetes"
        )
        spec = render_plan(plan, run_id="r").roles[0].workload["spec"]
        return {k: v for k, v in spec.items() if k in ("backoffLimit", "backoffLimitPerIndex", "podFailurePolicy")}

    fail_82 = {  # then preemption ignored: replaced, never counted (its own budget, preemption_retries)
        "rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "main", "operator": "In", "values": [82]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    assert job_spec(specs.RetryPolicy.APPLICATION, 4) == {"backoffLimit": 0, "podFailurePolicy": fail_82}
    assert job_spec(specs.RetryPolicy.REPLICA, 0) == {"backoffLimit": 0, "podFailurePolicy": fail_82}
    assert job_spec("ROLE", 2) == {"backoffLimit": 6, "podFailurePolicy": fail_82}
    assert job_spec(specs.RetryPolicy.HOT_SPARE, 2)["backoffLimitPerIndex"] == 2


def test_torchrun_role_runs_through_the_launch_shim(check):
    app = torchstep.materialize("dist.ddp", ["-j", "2x4", "--script", "train.py"])
    rendered = render_plan(torchstep.build_plan(app, "kubernetes"), namespace="ml", run_id="run-1")
    c = rendered.roles[0].workload["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["python", "-m", "torchstep.launch"]
    assert c["args"][:2] == ["bash", "-c"]
    # TorchX's $${...} became ${...}, then every $ is escaped for Kubernetes: bash gets ${TORCHX_RANK0_HOST:=localhost}
    assert "--rdzv_endpoint $${TORCHX_RANK0_HOST:=localhost}:29500" in c["args"][2]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TORCHX_RANK0_HOST"] == "train-train-4e65d3fb-0.train-train-4e65d3fb.ml.svc.cluster.local"
    assert env["TORCHSTEP_RDZV_ENDPOINT"] == env["TORCHX_RANK0_HOST"] + ":29500"
    check(rendered)


def test_elastic_job_succeeds_with_replica_0(role):
    plan = torchstep.build_plan(specs.AppDef("a", [role(num_replicas=4, min_replicas=2)]), "kubernetes")
    job = render_plan(plan, run_id="r").roles[0].workload
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--nnodes") + 1] == "2:4"


def test_run_options_reach_every_object(role):
    plan = torchstep.build_plan(specs.AppDef("a", [role(num_replicas=2), role(name="one")]), "kubernetes")
    cfg = {
        "queue": "team-a",
        "service_account": "sa",
        "priority_class": "high",
        "image_pull_secrets": ["regcred"],
        "labels": {"team": "ml"},
        "ttl_seconds_after_finished": 600,
        "active_deadline": 100,
        "shm_size": "8Gi",
        "result_file": "/airflow/xcom/return.json",
    }
    rendered = render_plan(plan, namespace="ml", run_id="r", cfg=cfg)
    job, pod = rendered.roles[0].workload, rendered.roles[1].workload
    for obj, spec in ((job, job["spec"]["template"]["spec"]), (pod, pod["spec"])):
        assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
        assert obj["metadata"]["labels"]["team"] == "ml"
        assert (spec["serviceAccountName"], spec["priorityClassName"]) == ("sa", "high")
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
        assert spec["volumes"][0] == {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["TORCHSTEP_RESULT_FILE"] == "/airflow/xcom/return.json"
    assert "kueue.x-k8s.io/queue-name" not in job["spec"]["template"]["metadata"]["labels"]
    assert (job["spec"]["ttlSecondsAfterFinished"], job["spec"]["activeDeadlineSeconds"]) == (600, 100)
    assert pod["spec"]["activeDeadlineSeconds"] == 100
    assert rendered.roles[0].service["metadata"]["labels"]["team"] == "ml"


def test_timeouts_smallest_wins_and_grace(role):
    r = role(metadata={"torchstep": {"timeout": 1800.2, "grace_period": 45}})
    plan = torchstep.build_plan(specs.AppDef("a", [r], metadata={"torchstep.timeout": "3600"}), "kubernetes")
    pod = render_plan(plan, run_id="r").roles[0].workload
    assert pod["spec"]["activeDeadlineSeconds"] == 1801
    assert pod["spec"]["terminationGracePeriodSeconds"] == 45 + 15
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--grace-period") + 1] == "45"


def test_service_owned_by_the_created_job(rendered):
    from torchstep.kubernetes import owned_by

    from .conftest import check_object

    job = {**rendered.roles[0].workload, "metadata": {**rendered.roles[0].workload["metadata"], "uid": "5a1d"}}
    service = owned_by(rendered.roles[0].service, job)
    assert service["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": NAME, "uid": "5a1d"}
    ]
    check_object(service)
    assert "ownerReferences" not in rendered.roles[0].service["metadata"]
    with pytest.raises(ValueError, match="uid"):
        owned_by(rendered.roles[0].service, rendered.roles[0].workload)
