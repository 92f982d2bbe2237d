"""``torchstep.policy`` against a stranger who may trigger runs (issue 33, items 2 and 4):
what a strict policy (``gpu=1``, no device mounts, ``volume_mounts=["datasets"]``) and
DEFAULT let through before — GPUs and devices under other names, a claim that clones
another team's volume, pods that outlive cancel, API tokens, node-local profiles, a
privileged container from a device mount, loader variables the denial missed, and requests
of any size planned before they were checked. Each is refused now, naming the field and
the fix; the allow-lists let through what a deployment lists."""

from __future__ import annotations

import pytest
import torchstep
from torchstep.components.appjson import app_to_dict
from torchstep.policy import DEFAULT, Policy, PolicyError, load
from torchx import specs

STRICT = Policy(gpu=1, device_mounts=(), volume_mounts=("datasets",))


def app(*, replicas=1, resource=None, **role_kw) -> specs.AppDef:
    role_kw.setdefault("entrypoint", "python")
    role_kw.setdefault("args", ["-m", "train"])
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        num_replicas=replicas,
        resource=resource or specs.Resource(cpu=2, gpu=0, memMB=1024),
        **role_kw,
    )
    return specs.AppDef("train", roles=[role])


def overlay(spec) -> specs.AppDef:
    return app(metadata={"kubernetes": spec})


def main(**container) -> specs.AppDef:
    return overlay({"containers": [{"name": "main", **container}]})


def refused(policy, a, target="kubernetes", cfg=None) -> PolicyError:
    with pytest.raises(PolicyError) as err:
        policy.check(a, target, cfg or {})
    assert isinstance(err.value, torchstep.SpecError) and err.value.fix and "polic" in str(err.value)
    return err.value


OV = "app.roles[0].metadata['kubernetes']"


# -- extended resources: an allow-list, and every GPU by any name counts --------------------
@pytest.mark.parametrize(
    "name, count",
    [("nvidia.com/mig-3g.40gb", 7), ("nvidia.com/gpu.shared", 8), ("squat.ai/kvm", 1), ("smarter-devices/fuse", 1)],
)
def test_extended_resources_that_are_gpus_or_devices_under_other_names_are_refused(name, count):
    a = app(resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={name: count}))
    for policy in (STRICT, DEFAULT):
        err = refused(policy, a)
        assert err.field == f"app.roles[0].resource.devices[{name!r}]"
        assert "extended_resources" in err.fix
    # the same names through an overlay's resources
    for where in ("limits", "requests"):
        err = refused(DEFAULT, main(resources={where: {name: str(count)}}))
        assert err.field == f"{OV}['containers'][0]['resources'][{where!r}][{name!r}]"


def test_a_gpu_limit_counts_every_resource_the_policy_knows_to_be_a_gpu():
    mig = Policy(gpu=1, extended_resources=("nvidia.com/*",))
    a = app(resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={"nvidia.com/mig-3g.40gb": 7}))
    err = refused(mig, a)
    assert err.field == "app.roles[0].resource.gpu" and "7 GPU(s)" in err.problem
    mig.check(
        app(resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={"nvidia.com/mig-1g.10gb": 1})), "kubernetes", {}
    )
    # a deployment names its own accelerators
    Policy(extended_resources=("acme.com/npu",)).check(
        app(resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={"acme.com/npu": 4})), "kubernetes", {}
    )
    own = Policy(gpu=2, extended_resources=("acme.com/npu",), gpu_resources=("acme.com/npu",))
    assert refused(own, app(resource=specs.Resource(cpu=1, gpu=0, memMB=256, devices={"acme.com/npu": 4}))).field == (
        "app.roles[0].resource.gpu"
    )
    # native resources in an overlay stay free; claims (dynamic resource allocation) do not
    DEFAULT.check(main(resources={"limits": {"cpu": "2", "memory": "4Gi", "hugepages-2Mi": "1Gi"}}), "kubernetes")
    assert refused(DEFAULT, main(resources={"claims": [{"name": "gpu"}]})).field.endswith("['resources']['claims']")
    assert refused(DEFAULT, overlay({"resourceClaims": [{"name": "gpu"}]})).field == f"{OV}['resourceClaims']"


# -- volumes: kinds from an allow-list; an ephemeral claim starts empty ---------------------
@pytest.mark.parametrize("source", ["dataSource", "dataSourceRef"])
def test_an_ephemeral_volume_cannot_clone_another_teams_claim(source):
    def eph(spec):
        return overlay({"volumes": [{"name": "x", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}]})

    fresh = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}}}
    STRICT.check(eph(fresh), "kubernetes", {})
    steal = eph({**fresh, source: {"kind": "PersistentVolumeClaim", "name": "team-b-checkpoints"}})
    err = refused(STRICT, steal)
    assert err.field == f"{OV}['volumes'][0]['ephemeral']['volumeClaimTemplate']['spec'][{source!r}]"
    assert "team-b-checkpoints" in err.problem
    snap = {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "datasets"}
    assert refused(STRICT, eph({**fresh, source: snap}))
    # a copy of a claim the policy already lets the step mount is no escalation
    STRICT.check(eph({**fresh, source: {"kind": "PersistentVolumeClaim", "name": "datasets"}}), "kubernetes", {})
    # binding an existing volume is refused too
    assert refused(STRICT, eph({**fresh, "volumeName": "pv-of-team-b"})).field.endswith("['volumeName']")
    assert refused(STRICT, eph({**fresh, "selector": {"matchLabels": {"team": "b"}}})).field.endswith("['selector']")


def test_volume_kinds_go_through_an_allow_list():
    nfs = overlay({"volumes": [{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]})
    err = refused(DEFAULT, nfs)
    assert err.field == f"{OV}['volumes'][0]['nfs']" and "volume_sources" in err.fix
    Policy(volume_sources=("nfs",)).check(nfs, "kubernetes", {})
    assert refused(Policy(volume_sources=("emptyDir",)), overlay({"volumes": [{"name": "c", "configMap": {}}]}))
    # a hostPath volume reaches what a BindMount may, nothing more
    host = overlay({"volumes": [{"name": "d", "hostPath": {"path": "/mnt/datasets/imagenet"}}]})
    assert refused(DEFAULT, host).field == f"{OV}['volumes'][0]['hostPath']"
    Policy(bind_mounts=("/mnt/datasets",)).check(host, "kubernetes", {})
    escape = overlay({"volumes": [{"name": "d", "hostPath": {"path": "/mnt/datasets/../../etc"}}]})
    assert refused(Policy(bind_mounts=("/mnt/datasets",)), escape)


# -- pods that outlive cancel and timeout --------------------------------------------------
def test_the_grace_period_is_capped_everywhere_a_request_can_set_it():
    err = refused(STRICT, overlay({"terminationGracePeriodSeconds": 2147483647}))
    assert err.field == f"{OV}['terminationGracePeriodSeconds']" and "300" in err.fix
    STRICT.check(overlay({"terminationGracePeriodSeconds": 30}), "kubernetes", {})
    assert refused(DEFAULT, app(), "local", {"grace_period": 2147483647}).field == "cfg['grace_period']"
    assert refused(DEFAULT, app(), "local", {"grace_period": "nan"}).field == "cfg['grace_period']"
    DEFAULT.check(app(), "local", {"grace_period": "5"})
    long_stop = app(metadata={"torchstep": {"grace_period": 86400}})
    assert refused(DEFAULT, long_stop).field == "app.roles[0].metadata['torchstep']['grace_period']"
    Policy(grace_period=86400).check(long_stop, "kubernetes", {})


# -- service account tokens ----------------------------------------------------------------
def test_api_tokens_and_token_audiences_go_through_allow_lists():
    err = refused(DEFAULT, overlay({"automountServiceAccountToken": True}))
    assert err.field == f"{OV}['automountServiceAccountToken']" and "pod_fields" in err.fix
    DEFAULT.check(overlay({"automountServiceAccountToken": False}), "kubernetes", {})

    def token(**src):
        return overlay({"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": src}]}}]})

    at = f"{OV}['volumes'][0]['projected']['sources'][0]['serviceAccountToken']"
    assert refused(DEFAULT, token(audience="https://bank.example.com", path="t")).field == f"{at}['audience']"
    assert refused(DEFAULT, token(path="t")).field == at  # no audience: a token for the Kubernetes API
    vault = Policy(token_audiences=("vault",))
    vault.check(token(audience="vault", path="t"), "kubernetes", {})
    assert refused(vault, token(audience="vault2", path="t"))
    api = Policy(pod_fields=(*DEFAULT.pod_fields, "automountServiceAccountToken"))
    api.check(overlay({"automountServiceAccountToken": True}), "kubernetes", {})
    api.check(token(path="t"), "kubernetes", {})


# -- pod fields: an allow-list ---------------------------------------------------------------
def test_pod_fields_go_through_an_allow_list():
    for key, value in (("runtimeClassName", "runc-unconfined"), ("nodeName", "n1"), ("schedulerName", "x")):
        policy = Policy(pod_fields=tuple(f for f in DEFAULT.pod_fields if f != key))
        err = refused(policy, overlay({key: value}))
        assert err.field == f"{OV}[{key!r}]" and "pod_fields" in err.fix
    Policy(pod_fields=("runtimeClassName",)).check(overlay({"runtimeClassName": "gvisor"}), "kubernetes", {})
    # listing a field torchstep checks itself does not lift its check
    assert refused(Policy(pod_fields=("hostPID", "terminationGracePeriodSeconds")), overlay({"hostPID": True}))
    assert refused(
        Policy(pod_fields=("terminationGracePeriodSeconds",)), overlay({"terminationGracePeriodSeconds": 2147483647})
    )


def test_probes_and_hooks_reach_the_pod_only_not_what_the_node_reaches():
    metadata = {"httpGet": {"host": "169.254.169.254", "path": "/latest/meta-data/", "port": 80}}
    err = refused(DEFAULT, main(livenessProbe=metadata))
    assert err.field == f"{OV}['containers'][0]['livenessProbe']['httpGet']['host']"
    hook = {"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 6443}}}
    assert refused(DEFAULT, main(lifecycle=hook)).field.endswith("['lifecycle']['preStop']['tcpSocket']['host']")
    DEFAULT.check(
        main(
            readinessProbe={"httpGet": {"path": "/healthz", "port": 8080}},
            lifecycle={"preStop": {"sleep": {"seconds": 5}}},
        ),
        "kubernetes",
        {},
    )


# -- node-local profiles ---------------------------------------------------------------------
@pytest.mark.parametrize("key", ["seccompProfile", "appArmorProfile"])
def test_a_localhost_profile_is_refused_unless_the_policy_lists_it(key):
    local = main(securityContext={key: {"type": "Localhost", "localhostProfile": "profiles/allow-all.json"}})
    err = refused(STRICT, local)
    assert err.field == f"{OV}['containers'][0]['securityContext'][{key!r}]" and "localhost_profiles" in err.fix
    Policy(localhost_profiles=("profiles/allow-all.json",)).check(local, "kubernetes", {})
    assert refused(STRICT, main(securityContext={key: {"type": "Localhost"}}))  # no profile named
    STRICT.check(main(securityContext={key: {"type": "RuntimeDefault"}}), "kubernetes", {})


# -- a device mount is a privileged container on Kubernetes ----------------------------------
def test_a_device_mount_is_refused_on_kubernetes_as_privileged_is_and_the_render_agrees():
    from torchstep.kubernetes import render

    dev = app(mounts=[specs.DeviceMount(src_path="/dev/fuse", dst_path="/dev/fuse")])
    one = Policy(device_mounts=("/dev/fuse",))
    err = refused(one, dev)
    assert err.field == "app.roles[0].mounts[0]" and "privileged" in err.problem
    one.check(dev, "local", {})  # on this machine a device is a path, no privilege
    # as an overlay asking for privileged: refused, unless the deployment trusts overlays
    assert refused(one, main(securityContext={"privileged": True}))
    trusted = Policy(device_mounts=("/dev/fuse",), overlay="any")
    trusted.check(dev, "kubernetes", {})
    pods = [o for o in render(dev, namespace="default") if o["kind"] in ("Pod", "Job")]
    spec = pods[0]["spec"] if pods[0]["kind"] == "Pod" else pods[0]["spec"]["template"]["spec"]
    assert spec["containers"][0]["securityContext"] == {"privileged": True}  # what overlay = "any" allows


# -- the env denial ----------------------------------------------------------------------------
LOADERS = [
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "NCCL_NET_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",
    "SHELLOPTS",
    "PS4",
    "PYTHONINSPECT",
    "BASH_ENV",
    "ENV",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "LD_AUDIT",
    "GCONV_PATH",
    "NCCL_CONF_FILE",
    "CUDA_INJECTION64_PATH",
    "OMPI_MCA_mca_base_component_path",
    "TRITON_CACHE_DIR",
    "TRITON_LIBCUDA_PATH",
    "PET_RDZV_ENDPOINT",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHSTEP_RESULT_FILE",
    "NVIDIA_VISIBLE_DEVICES",
    "OPENSSL_CONF",
    "BASH_FUNC_ls%%",
    "PYTHONPYCACHEPREFIX",
    "FI_PROVIDER_PATH",
]


@pytest.mark.parametrize("name", LOADERS)
def test_variables_that_load_code_or_redirect_the_agent_are_denied_wherever_env_is_set(name):
    assert refused(STRICT, app(env={name: "/tmp/evil"}), "local").field == f"app.roles[0].env[{name!r}]"
    assert refused(STRICT, app(env={name.lower(): "x"}), "local")  # in any case
    err = refused(STRICT, main(env=[{"name": name, "value": "x"}]))
    assert err.field == f"{OV}['containers'][0]['env'][0]['name']"


def test_ordinary_training_variables_still_pass():
    ok = {
        "LOGLEVEL": "INFO",
        "OMP_NUM_THREADS": "4",
        "NCCL_DEBUG": "INFO",
        "NCCL_SOCKET_IFNAME": "eth0",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "PYTHONUNBUFFERED": "1",
        "TORCHX_TRACKING_EXPERIMENT_NAME": "x",
        "NVIDIA_TF32_OVERRIDE": "0",
        "GIT_COMMIT": "abc",
        "CUDA_LAUNCH_BLOCKING": "1",
        "TORCHSTEP_TEST_MARK": "m",
    }
    assert STRICT.problems(app(env=ok), "local") == []


# -- sizes: DEFAULT caps, checked before the plan ----------------------------------------------
def test_default_refuses_ten_thousand_replicas_of_4096_processes():
    huge = app(replicas=10_000, metadata={"torchstep": {"nproc_per_node": 4096}})
    fields = [e.field for e in DEFAULT.problems(huge, "local")]
    assert "app.roles[0].num_replicas" in fields
    assert "app.roles[0].metadata['torchstep']['nproc_per_node']" in fields
    assert "app.roles" in fields  # 40,960,000 processes in all
    ddp = torchstep.materialize("dist.ddp", ["-j", "4x32", "--script", "train.py"])  # a role's own torchrun
    assert [e.field for e in DEFAULT.problems(ddp, "kubernetes")] == ["app.roles[0].args", "app.roles"]
    DEFAULT.check(torchstep.materialize("dist.ddp", ["-j", "2x8", "--script", "train.py"]), "kubernetes")
    auto = app(entrypoint="torchrun", args=["--nproc-per-node", "auto", "train.py"])
    assert [e.field for e in DEFAULT.problems(auto, "local")] == ["app.roles[0].args", "app.roles"]
    Policy(nproc=None, processes=None).check(auto, "local", {})


def test_too_many_roles_are_refused_before_any_role_is_looked_at():
    roles = [specs.Role(f"r{i}", image="x", entrypoint="sh", env={"LD_PRELOAD": "/x.so"}) for i in range(10_000)]
    problems = DEFAULT.problems(specs.AppDef("wide", roles=roles), "local")
    assert [(e.field, "10000 roles" in e.problem) for e in problems] == [("app.roles", True)]
    # in all, processes count across roles: 5 roles of 16 are 80 > 64
    five = specs.AppDef(
        "five", roles=[specs.Role(f"r{i}", image="x", entrypoint="sh", num_replicas=16) for i in range(5)]
    )
    assert [e.field for e in DEFAULT.problems(five, "local")] == ["app.roles"]


def test_argv_and_env_sizes_are_capped_per_role():
    err = refused(DEFAULT, app(args=["-c", "x" * 70_000]), "local")
    assert err.field == "app.roles[0].args" and "args_bytes" in err.fix
    err = refused(DEFAULT, app(env={f"V{i}": "y" * 1000 for i in range(70)}), "local")
    assert err.field == "app.roles[0].env" and "env_bytes" in err.fix
    assert refused(DEFAULT, app(args=["é" * 40_000]), "local").field == "app.roles[0].args"  # bytes, not characters
    Policy(args_bytes=None, env_bytes=None).check(app(args=["x" * 70_000]), "local", {})


def test_a_network_request_is_checked_by_size_then_policy_before_it_is_planned(monkeypatch):
    import torchstep.plan.planner as planner
    from torchstep.schedulers import base
    from torchstep.schedulers.generic import step_received

    planned = []
    real = planner.build_plan
    monkeypatch.setattr(planner, "build_plan", lambda a, t: planned.append(t) or real(a, t))
    wide = specs.AppDef("wide", roles=[specs.Role(f"r{i}", image="x", entrypoint="sh") for i in range(2000)])
    with pytest.raises(PolicyError, match=r"^app\.roles \(target 'local'\): 2000 roles"):
        step_received(
            {"app": app_to_dict(wide), "target": "local"}, field="conf", what="the DAG run", scheduler="airflow"
        )
    assert planned == []  # refused before any planning
    # too large as sent: refused before it is even parsed
    parsed = []
    monkeypatch.setattr("torchstep.components.appjson.app_from_dict", lambda d: parsed.append(d))
    big = {"version": 1, "name": "a", "roles": [{"name": "w", "args": ["x" * 300_000]}]}
    with pytest.raises(PolicyError, match=r"^conf\['app'\] \(target 'local'\): the request is more than 262144"):
        base.app_received(big, "local", {}, field="conf['app']")
    with pytest.raises(PolicyError, match=r"^cfg \(target 'local'\): the request is more than"):
        base.app_received({"name": "a"}, "local", {"tee": "y" * 300_000})
    deep: object = "x"
    for _ in range(100_000):  # deeper than any parser's recursion
        deep = [deep]
    with pytest.raises(PolicyError, match="nests deeper than 64 levels"):
        base.app_received({"name": "a", "roles": deep}, "local", {})
    assert parsed == [] and planned == []


def test_a_network_request_the_policy_allows_is_still_planned():
    from torchstep.schedulers.base import app_received

    got, plan = app_received(app_to_dict(app(replicas=2)), "kubernetes", {}, DEFAULT)
    assert plan.roles[0].num_replicas == 2 and got.roles[0].name == "trainer"


# -- the policy file -----------------------------------------------------------------------------
def test_the_new_fields_load_from_a_policy_file_and_bad_values_name_the_field(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(
        'extended_resources = ["nvidia.com/mig-*"]\ntoken_audiences = ["vault"]\n'
        "roles = 2\nprocesses = 8\ngrace_period = 30.5\nconf_bytes = 1000000\n"
    )
    p = load(path)
    assert (p.extended_resources, p.token_audiences, p.roles, p.processes, p.grace_period) == (
        ("nvidia.com/mig-*",),
        ("vault",),
        2,
        8,
        30.5,
    )
    assert p.pod_fields == DEFAULT.pod_fields  # a field not in the file keeps its default
    for kwargs, field in (
        ({"roles": -1}, "roles"),
        ({"nproc": 2.5}, "nproc"),
        ({"grace_period": "long"}, "grace_period"),
        ({"pod_fields": "tolerations"}, "pod_fields"),
        ({"token_audiences": [""]}, "token_audiences"),
    ):
        with pytest.raises(PolicyError) as e:
            Policy(**kwargs)
        assert e.value.field == field
