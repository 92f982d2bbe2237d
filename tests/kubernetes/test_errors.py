"""Bad input → a SpecError naming the field (and saying what to do instead)."""

from __future__ import annotations

import pytest
import torchstep
from torchstep.kubernetes import render, render_plan, render_pod
from torchx import specs

K = "roles[0].metadata['kubernetes']"


def spec_error(fn, *args, **kwargs) -> torchstep.SpecError:
    with pytest.raises(torchstep.SpecError) as info:
        fn(*args, **kwargs)
    assert info.value.fix, "every SpecError says what to do instead"
    return info.value


@pytest.mark.parametrize(
    ("role_kw", "app_kw", "field"),
    [
        ({"resource": specs.Resource(2, 0, 1024, capabilities={"gpu-type": "a100"})}, {}, "capabilities['gpu-type']"),
        ({"name": "模型"}, {}, "roles[0].name"),
        ({}, {"name": "a/b"}, "name"),
        ({"image": ""}, {}, "roles[0].image"),
        ({"mounts": [specs.VolumeMount(src="Bad_Claim", dst_path="/d")]}, {}, "roles[0].mounts[0].src"),
        ({"port_map": {"Tensor_Board": 6006}}, {}, "roles[0].port_map['Tensor_Board']"),
    ],
)
def test_planner_rejections_name_the_field(role, role_kw, app_kw, field):
    app = specs.AppDef(name=app_kw.get("name", "train"), roles=[role(**role_kw)])
    err = spec_error(render, app)
    assert err.field.endswith(field) and err.target == "kubernetes"


@pytest.mark.parametrize(
    ("overlay", "field"),
    [
        ({"restartPolicy": "Always"}, f"{K}['restartPolicy']"),
        (
            {"nodeSelector": {"node.kubernetes.io/instance-type": "g5"}},
            f"{K}['nodeSelector']['node.kubernetes.io/instance-type']",
        ),
        ({"containers": [{"name": "main", "image": "other:1"}]}, f"{K}['containers'][0]['image']"),
        (
            {"containers": [{"name": "main", "env": [{"name": "TORCHSTEP_ROLE", "value": "x"}]}]},
            f"{K}['containers'][0]['env'][0]['value']",
        ),
        ({"volumes": [{"name": "dshm", "hostPath": {"path": "/dev/shm"}}]}, f"{K}['volumes'][0]['hostPath']"),
        ({"serviceAccountName": "other"}, f"{K}['serviceAccountName']"),
        ({"spec": {"subdomain": "elsewhere"}}, f"{K}['spec']['subdomain']"),
        ({"metadata": {"labels": {"torchstep/role": "x"}}}, f"{K}['metadata']['labels']['torchstep/role']"),
        ({"metadata": {"name": "mine"}}, f"{K}['metadata']['name']"),
        ({"spec": {}, "tolerations": []}, f"{K}['spec']"),
        ({"spec": ["not", "a", "mapping"]}, f"{K}['spec']"),
    ],
)
def test_conflicting_overlay(role, overlay, field):
    r = role(
        num_replicas=2,
        resource=specs.Resource(2, 0, 1024, capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"}),
        metadata={"kubernetes": overlay},
    )
    err = spec_error(render, specs.AppDef("a", [r]), cfg={"service_account": "trainer"})
    assert err.field == field


def test_overlay_may_repeat_what_is_rendered(role, check):
    overlay = {"restartPolicy": "Never", "nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}
    r = role(
        resource=specs.Resource(2, 0, 1024, capabilities=overlay["nodeSelector"]), metadata={"kubernetes": overlay}
    )
    check(render_plan(torchstep.build_plan(specs.AppDef("a", [r]), "kubernetes"), run_id="r"))


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"queu": "a"}, "cfg['queu']"),
        ({"queue": "Team A"}, "cfg['queue']"),
        ({"namespace": "ML"}, "cfg['namespace']"),
        ({"labels": {"torchstep/app-id": "x"}}, "cfg['labels']['torchstep/app-id']"),
        ({"labels": "kueue.x-k8s.io/queue-name:q"}, "cfg['labels']['kueue.x-k8s.io/queue-name']"),
        ({"labels": {"team": "a b"}}, "cfg['labels']['team']"),
        ({"labels": "team=ml"}, "cfg['labels']"),
        ({"annotations": {"torchstep/app-name": "x"}}, "cfg['annotations']['torchstep/app-name']"),
        ({"shm_size": "8 GB"}, "cfg['shm_size']"),
        ({"pod": "maybe"}, "cfg['pod']"),
        ({"ttl_seconds_after_finished": -1}, "cfg['ttl_seconds_after_finished']"),
        ({"active_deadline": 0}, "cfg['active_deadline']"),
        ({"rdzv_port": 70000}, "cfg['rdzv_port']"),
        ({"image_pull_policy": "always"}, "cfg['image_pull_policy']"),
        ({"image_pull_secrets": ["Reg Cred"]}, "cfg['image_pull_secrets']"),
        ({"result_file": "out.json"}, "cfg['result_file']"),
        ({"run_id": " "}, "cfg['run_id']"),
        ({"join_timeout": True}, "cfg['join_timeout']"),
    ],
)
def test_bad_run_options(role, cfg, field):
    err = spec_error(render, specs.AppDef("a", [role()]), cfg=cfg)
    assert err.field == field and err.target == "kubernetes"


def test_namespace_argument_conflicts_with_cfg(role):
    err = spec_error(render, specs.AppDef("a", [role()]), namespace="ml", cfg={"namespace": "other"})
    assert err.field == "cfg['namespace']"
    assert render(specs.AppDef("a", [role()]), cfg={"namespace": "other"})[0]["metadata"]["namespace"] == "other"


def test_gpu_requested_twice(role):
    r = role(resource=specs.Resource(2, 2, 1024, devices={"nvidia.com/gpu": 2}))
    assert spec_error(render, specs.AppDef("a", [r])).field == "roles[0].resource.devices['nvidia.com/gpu']"


def test_port_taken_by_the_rendezvous(role):
    r = role(num_replicas=2, port_map={"tb": 29500})
    assert spec_error(render, specs.AppDef("a", [r])).field == "roles[0].port_map['tb']"
    # one replica: no rendezvous port on the network, no conflict
    render(specs.AppDef("a", [role(port_map={"tb": 29500})]))


def test_secret_env_shadowing_torchstep_variables(role):
    r = role(metadata={"torchstep": {"secret_env": {"TORCHSTEP_APP_ID": "s/k"}}})
    err = spec_error(render, specs.AppDef("a", [r]))
    assert err.field == "roles[0].metadata['torchstep']['secret_env']['TORCHSTEP_APP_ID']"


def test_bare_pod_cannot_carry_role_retries(role):
    app = specs.AppDef("a", [role(max_retries=2, retry_policy="ROLE")])
    assert spec_error(render, app, cfg={"pod": True}).field == "cfg['pod']"
    assert [o["kind"] for o in render(app)] == ["Job"]


def test_render_pod_needs_one_replica_and_one_role(role):
    assert spec_error(render_pod, specs.AppDef("a", [role(num_replicas=2)])).field == "roles[0].num_replicas"
    two = specs.AppDef("a", [role(name="x"), role(name="y")])
    assert spec_error(render_pod, two).field == "role"
    assert spec_error(render_pod, two, role="z").field == "role"
    assert render_pod(two, role="y")["metadata"]["labels"]["torchstep/role"] == "y"


def test_plan_for_another_target(role):
    plan = torchstep.build_plan(specs.AppDef("a", [role()]), "kfp")
    assert spec_error(render_plan, plan).field == "target"


def test_run_id_given_twice(role):
    plan = torchstep.build_plan(specs.AppDef("a", [role()]), "kubernetes")
    assert spec_error(render_plan, plan, run_id="a", cfg={"run_id": "b"}).field == "cfg['run_id']"
