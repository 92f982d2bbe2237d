"""``torchstep.policy`` (issue 24): what an AppDef from a DAG-run conf or flow-run
parameters may do. A stranger's AppDef that reaches the host, the node or the cluster's
trust is refused by DEFAULT with the field and what the policy allows; the comparisons are
made on normalised values, so the usual spellings that dodge a prefix check do not."""

from __future__ import annotations

import os
import pickle
import re
from pathlib import Path

import pytest
import torchstep
from torchstep.policy import DEFAULT, Policy, PolicyError, load, resolve, untrusted_cfg
from torchx import specs

ROOT = Path(__file__).resolve().parents[2]


def app(image="ghcr.io/acme/train:1", *, replicas=1, resource=None, **role_kw):
    role = specs.Role(
        "trainer",
        image=image,
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        resource=resource or specs.Resource(cpu=2, gpu=0, memMB=1024),
        **role_kw,
    )
    return specs.AppDef("train", roles=[role])


def overlay(spec):
    return app(metadata={"kubernetes": spec})


def refused(policy, a, target="kubernetes", cfg=None) -> PolicyError:
    with pytest.raises(PolicyError) as err:
        policy.check(a, target, cfg or {})
    assert isinstance(err.value, torchstep.SpecError) and err.value.fix
    return err.value


STRANGER = [
    ("local", app(mounts=[specs.BindMount(src_path="/", dst_path="/host")]), {}, "app.roles[0].mounts[0].src_path"),
    (
        "kubernetes",
        app(mounts=[specs.BindMount(src_path="/etc/", dst_path="/x")]),
        {},
        "app.roles[0].mounts[0].src_path",
    ),
    (
        "local",
        app(mounts=[specs.DeviceMount(src_path="/dev/mem", dst_path="/dev/mem")]),
        {},
        "app.roles[0].mounts[0].src_path",
    ),
    ("local", app(env={"LD_PRELOAD": "/tmp/x.so"}), {}, "app.roles[0].env['LD_PRELOAD']"),
    ("local", app(env={"ld_preload": "/tmp/x.so"}), {}, "app.roles[0].env['ld_preload']"),
    ("local", app(env={"PYTHONPATH": "/tmp/evil"}), {}, "app.roles[0].env['PYTHONPATH']"),
    ("local", app(env={"BASH_ENV": "/tmp/evil.sh"}), {}, "app.roles[0].env['BASH_ENV']"),
    ("kubernetes", overlay({"hostPID": True}), {}, "app.roles[0].metadata['kubernetes']['hostPID']"),
    ("kubernetes", overlay({"hostNetwork": True}), {}, "app.roles[0].metadata['kubernetes']['hostNetwork']"),
    ("kubernetes", overlay({"spec": {"hostIPC": True}}), {}, "app.roles[0].metadata['kubernetes']['spec']['hostIPC']"),
    (
        "kubernetes",
        overlay({"containers": [{"name": "main", "securityContext": {"privileged": True}}]}),
        {},
        "app.roles[0].metadata['kubernetes']['containers'][0]['securityContext']['privileged']",
    ),
    (
        "kubernetes",
        overlay(
            {
                "initContainers": [
                    {"name": "i", "image": "busybox", "securityContext": {"allowPrivilegeEscalation": True}}
                ]
            }
        ),
        {},
        "app.roles[0].metadata['kubernetes']['initContainers'][0]['securityContext']['allowPrivilegeEscalation']",
    ),
    (
        "kubernetes",
        overlay({"ephemeralContainers": [{"name": "e", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}),
        {},
        "app.roles[0].metadata['kubernetes']['ephemeralContainers'][0]['securityContext']['capabilities']",
    ),
    (
        "kubernetes",
        overlay({"containers": [{"name": "main", "securityContext": {"runAsUser": 0}}]}),
        {},
        "app.roles[0].metadata['kubernetes']['containers'][0]['securityContext']['runAsUser']",
    ),
    (
        "kubernetes",
        overlay({"securityContext": {"runAsUser": 1000}}),
        {},
        "app.roles[0].metadata['kubernetes']['securityContext']",
    ),
    (
        "kubernetes",
        overlay({"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}}),
        {},
        "app.roles[0].metadata['kubernetes']['spec']['volumes'][0]['hostPath']",
    ),
    (
        "kubernetes",
        overlay({"volumes": [{"name": "s", "secret": {"secretName": "admin-token"}}]}),
        {},
        "app.roles[0].metadata['kubernetes']['volumes'][0]['secret']",
    ),
    (
        "kubernetes",
        overlay({"volumes": [{"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}]}),
        {},
        "app.roles[0].metadata['kubernetes']['volumes'][0]['nfs']",
    ),
    (
        "kubernetes",
        overlay({"containers": [{"name": "main", "envFrom": [{"secretRef": {"name": "db"}}]}]}),
        {},
        "app.roles[0].metadata['kubernetes']['containers'][0]['envFrom']",
    ),
    (
        "kubernetes",
        overlay({"containers": [{"name": "main", "env": [{"name": "LD_PRELOAD", "value": "/x.so"}]}]}),
        {},
        "app.roles[0].metadata['kubernetes']['containers'][0]['env'][0]['name']",
    ),
    (
        "kubernetes",
        overlay(
            {
                "containers": [
                    {
                        "name": "main",
                        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "cloud-creds", "key": "k"}}}],
                    }
                ]
            }
        ),
        {},
        "app.roles[0].metadata['kubernetes']['containers'][0]['env'][0]['valueFrom']['secretKeyRef']",
    ),
    (
        "kubernetes",
        overlay({"containers": [{"name": "main", "ports": [{"containerPort": 22, "hostPort": 22}]}]}),
        {},
        "app.roles[0].metadata['kubernetes']['containers'][0]['ports'][0]",
    ),
    (
        "kubernetes",
        overlay({"serviceAccountName": "cluster-admin"}),
        {},
        "app.roles[0].metadata['kubernetes']['serviceAccountName']",
    ),
    ("kubernetes", overlay({"nodeName": "control-plane-0"}), {}, "app.roles[0].metadata['kubernetes']['nodeName']"),
    (
        "kubernetes",
        overlay({"metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}}}),
        {"annotations": None},
        "app.roles[0].metadata['kubernetes']['metadata']['annotations']",
    ),
    (
        "kubernetes",
        app(metadata={"torchstep": {"secret_env": {"AWS_KEY": "cloud-creds/key"}}}),
        {},
        "app.roles[0].metadata['torchstep']['secret_env']['AWS_KEY']",
    ),
    ("kubernetes", app(), {"namespace": "kube-system"}, "cfg['namespace']"),
    ("kubernetes", app(), {"service_account": "admin"}, "cfg['service_account']"),
    ("kubernetes", app(), {"image_pull_secrets": "regcred"}, "cfg['image_pull_secrets']"),
    ("kubernetes", app(), {"priority_class": "system-cluster-critical"}, "cfg['priority_class']"),
    ("kubernetes", app(), {"labels": "role:db-client"}, "cfg['labels']"),
    ("kubernetes", app(), {"run_id": "someone-elses-run"}, "cfg['run_id']"),
    ("local", app(), {"inherit_env": True}, "cfg['inherit_env']"),
    ("local", app(), {"log_dir": "/home/victim/.ssh"}, "cfg['log_dir']"),
    ("local", app(), {"checkpoint_dir": "/home/victim/ckpt"}, "cfg['checkpoint_dir']"),
    ("local", app(), {"gpus": "0;1;2;3"}, "cfg['gpus']"),
    ("local", app(), {"no_such_option": 1}, "cfg['no_such_option']"),
]


@pytest.mark.parametrize(("target", "a", "cfg", "field"), STRANGER, ids=[s[3] for s in STRANGER])
def test_default_refuses_what_a_stranger_sends_naming_the_field(target, a, cfg, field):
    err = refused(DEFAULT, a, target, cfg)
    assert err.field == field and err.target == target
    assert "polic" in str(err)  # says it is the deployment's policy, and (fix) what it allows


def test_a_plain_training_step_passes_the_default():
    ok = app(
        replicas=2,
        env={"LOGLEVEL": "INFO", "OMP_NUM_THREADS": "4"},
        mounts=[specs.VolumeMount(src="datasets", dst_path="/data", read_only=True)],
        metadata={
            "torchstep": {"timeout": 3600},
            "kubernetes": {
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                "nodeSelector": {"pool": "a100"},
                "volumes": [{"name": "cache", "emptyDir": {}}],
                "containers": [
                    {
                        "name": "main",
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache"}],
                        "securityContext": {
                            "runAsUser": 1000,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
            },
        },
    )
    DEFAULT.check(ok, "kubernetes", {"timeout": None, "active_deadline": 600, "queue": None})
    DEFAULT.check(
        torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"]),
        "local",
        {"timeout": 60, "grace_period": "5", "inherit_env": False},
    )
    assert DEFAULT.problems(ok, "kubernetes", {}) == []


@pytest.mark.parametrize(
    ("src", "allowed"),
    [
        ("/data", True),
        ("/data/", True),
        ("/data/x/", True),
        ("//data/x", True),
        ("/data/./a/../b", True),
        ("/data/../etc", False),
        ("/data2", False),
        ("/data2/x", False),
        ("/dat", False),
        ("/", False),
        ("data/x", False),
        ("/data/x/../../etc/passwd", False),
    ],
)
def test_host_paths_are_compared_normalised_and_whole(src, allowed):
    policy = Policy(bind_mounts=("/data/",), device_mounts=("/dev/nvidia0",))
    a = app(mounts=[specs.BindMount(src_path=src, dst_path="/d")])
    assert (policy.problems(a, "kubernetes") == []) is allowed
    # (local: on Kubernetes a device mount makes the container privileged; test_policy_allowlists.py)
    assert policy.problems(app(mounts=[specs.DeviceMount("/dev/nvidia0", "/dev/nvidia0")]), "local") == []
    assert policy.problems(app(mounts=[specs.DeviceMount("/dev/nvidia01", "/d")]), "local")


def test_on_this_machine_a_symlink_under_an_allowed_prefix_does_not_lead_out(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "escape").symlink_to("/etc")
    (data / "inside").mkdir()
    policy = Policy(bind_mounts=(str(data),))
    escape = app(mounts=[specs.BindMount(src_path=str(data / "escape"), dst_path="/d")])
    err = refused(policy, escape, "local")
    assert "leads to '/etc'" in err.problem
    policy.check(app(mounts=[specs.BindMount(src_path=str(data / "inside"), dst_path="/d")]), "local", {})
    # the allowed prefix itself may be a link (its real path is allowed too)
    (tmp_path / "alias").symlink_to(data)
    Policy(bind_mounts=(str(tmp_path / "alias"),)).check(
        app(mounts=[specs.BindMount(src_path=str(tmp_path / "alias" / "inside"), dst_path="/d")]), "local", {}
    )
    # the checkpoint and log directories are host paths too
    Policy(bind_mounts=(str(data),)).check(app(), "local", {"checkpoint_dir": str(data / "inside" / "ck")})
    refused(policy, app(), "local", {"checkpoint_dir": str(data / "escape" / "ck")})


@pytest.mark.parametrize(
    ("image", "allowed"),
    [
        ("ghcr.io/acme/train:1", True),
        ("ghcr.io/acme/team/x@sha256:" + "a" * 64, True),
        ("GHCR.io/acme/x", True),
        ("python", True),
        ("python:3.11", True),
        ("docker.io/python:3.11", True),
        ("docker.io/library/python", True),
        ("index.docker.io/library/python:3", True),
        ("ghcr.io/acmeevil/x", False),
        ("ghcr.io/acme/../evil/x", False),
        ("ghcr.io/ACME/x", False),
        ("evil/python", False),
        ("pythonx", False),
        ("docker.io/evil/python", False),
        ("ghcr.io.evil.com/acme/x", False),
        ("ghcr.io/acme", True),
        ("", False),
        ("localhost:5000/acme/x", False),
    ],
)
def test_images_are_compared_as_the_runtime_resolves_them(image, allowed):
    policy = Policy(images=("ghcr.io/acme", "python"))
    assert (policy.problems(app(image=image), "kubernetes") == []) is allowed
    # an overlay's sidecar is an image too
    side = overlay({"containers": [{"name": "side", "image": image}]})
    assert (policy.problems(side, "kubernetes") == []) is (allowed and image != "")


def test_image_entries_pin_a_tag_or_cover_a_registry():
    assert Policy(images=("ghcr.io/",)).problems(app(image="ghcr.io/anyone/x:1"), "kubernetes") == []
    assert Policy(images=("ghcr.io/",)).problems(app(image="docker.io/ghcr.io/x"), "kubernetes")
    pinned = Policy(images=("python:3.11",))
    assert pinned.problems(app(image="python:3.11"), "kubernetes") == []
    assert pinned.problems(app(image="python:3.12"), "kubernetes")
    assert pinned.problems(app(image="python:3.11@sha256:" + "b" * 64), "kubernetes") == []
    assert Policy(images=("docker.io/acme/",)).problems(app(image="acme/train"), "kubernetes") == []


def test_namespaces_service_accounts_and_secrets_are_names_or_patterns():
    policy = Policy(namespaces=("team-*",), service_accounts=("trainer",), secrets=("hf-token",))
    policy.check(
        app(metadata={"torchstep": {"secret_env": {"HF_TOKEN": "hf-token/token"}}}),
        "kubernetes",
        {"namespace": "team-a", "service_account": "trainer", "image_pull_secrets": ["hf-token"]},
    )
    assert refused(policy, app(), cfg={"namespace": "kube-system"}).field == "cfg['namespace']"
    assert refused(policy, app(), cfg={"service_account": "trainer2"}).field == "cfg['service_account']"
    assert "trainer" in refused(policy, overlay({"serviceAccountName": "default-admin"})).fix


def test_naming_the_deployments_own_namespace_or_service_account_is_always_allowed():
    # what a request that names nothing gets anyway: asking for it by name asks for nothing more
    for policy in (DEFAULT, Policy(namespaces=("ml",), service_accounts=("trainer",))):
        policy.check(app(), "kubernetes", {"namespace": "default", "service_account": "default"})
        policy.check(overlay({"serviceAccountName": "default"}), "kubernetes", {})
    assert refused(DEFAULT, app(), cfg={"namespace": "ml"}).field == "cfg['namespace']"
    assert refused(DEFAULT, app(), cfg={"service_account": "admin"}).field == "cfg['service_account']"


def test_limits_per_role_count_every_way_of_asking():
    policy = Policy(replicas=2, gpu=1, cpu=4, memMB=4096)
    policy.check(app(replicas=2, resource=specs.Resource(cpu=4, gpu=1, memMB=4096)), "kubernetes", {})
    cases = {
        "app.roles[0].num_replicas": app(replicas=3, resource=specs.Resource(cpu=1, gpu=0, memMB=1)),
        "app.roles[0].resource.gpu": app(resource=specs.Resource(cpu=1, gpu=1, memMB=1, devices={"nvidia.com/gpu": 1})),
        "app.roles[0].resource.cpu": app(resource=specs.Resource(cpu=-1, gpu=0, memMB=1)),  # unset: the whole node
        "app.roles[0].resource.memMB": app(resource=specs.Resource(cpu=1, gpu=0, memMB=8192)),
        "app.roles[0].metadata['kubernetes']['containers'][0]['resources']": app(
            resource=specs.Resource(cpu=1, gpu=0, memMB=1),
            metadata={"kubernetes": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 8}}}]}},
        ),
    }
    for field, a in cases.items():
        assert refused(policy, a).field == field


def test_overlay_modes_and_unknown_fields_fail_closed():
    assert refused(Policy(overlay="none"), overlay({"tolerations": []})).field == "app.roles[0].metadata['kubernetes']"
    Policy(overlay="any").check(overlay({"hostPID": True}), "kubernetes", {})
    # a pod spec field the policy does not know (a future Kubernetes one) is refused until someone decides
    assert refused(DEFAULT, overlay({"hostSomethingNew": True})).field.endswith("['hostSomethingNew']")
    assert refused(DEFAULT, overlay({"containers": [{"name": "main", "newField": 1}]})).field.endswith("['newField']")
    # a macro cannot turn into root later: only a positive integer is a safe user id
    assert refused(DEFAULT, overlay({"containers": [{"name": "m", "securityContext": {"runAsUser": "${replica_id}"}}]}))


def test_targets_and_the_local_directories():
    only_k8s = Policy(targets=("kubernetes",))
    assert refused(only_k8s, app(), "local").field == "target"
    assert untrusted_cfg("local", {"timeout": 5}) == {"timeout": 5, "inherit_env": False}
    assert untrusted_cfg("kubernetes", {"namespace": "ml"}) == {"namespace": "ml"}


def test_every_run_option_of_every_target_is_classified():
    """A new run option must be classified before a network cfg may set it (the policy
    refuses an option it does not know): this keeps the tables in step."""
    from torchstep.kubernetes.options import _OPTS as K8S
    from torchstep.local.options import _OPTS as LOCAL
    from torchstep.policy.rules import CFG_RULES

    assert set(CFG_RULES["local"]) == set(LOCAL)
    assert set(CFG_RULES["kubernetes"]) == set(K8S)


def test_policy_errors_survive_pickling_and_bad_policies_say_what_is_wrong():
    err = pickle.loads(pickle.dumps(refused(DEFAULT, app(), cfg={"namespace": "kube-system"})))
    assert type(err) is PolicyError and err.field == "cfg['namespace']" and "kube-system" in str(err)
    for kwargs, field in (
        ({"overlay": "privileged"}, "overlay"),
        ({"gpu": -1}, "gpu"),
        ({"replicas": 1.5}, "replicas"),
        ({"images": "ghcr.io/acme"}, "images"),
        ({"bind_mounts": ("data",)}, "bind_mounts"),
        ({"options": ("namespace",)}, "options"),
        ({"targets": ("kfp",)}, "targets"),
    ):
        with pytest.raises(PolicyError) as e:
            Policy(**kwargs)
        assert e.value.field == field


def security_toml() -> str:
    text = (ROOT / "docs" / "security.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/security.md shows one complete policy file"
    return blocks[0]


def test_the_policy_file_of_docs_security_md_loads_and_means_what_it_says(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(security_toml())
    policy = load(path)
    every = {f for f in Policy.__dataclass_fields__}
    assert every <= set(re.findall(r"^(\w+) =", security_toml(), re.M)), "the example sets every field"
    assert policy != DEFAULT and policy.targets == ("kubernetes",)
    assert refused(policy, app(), "kubernetes", {"namespace": "kube-system"}).field == "cfg['namespace']"


def test_a_policy_file_with_an_unknown_key_or_a_bad_value_is_an_error_naming_it(tmp_path, monkeypatch):
    bad = tmp_path / "bad.toml"
    bad.write_text('targets = ["kubernetes"]\nnamespace = ["ml"]\n')  # a typo: namespaces
    with pytest.raises(PolicyError, match=r"namespace: unknown key in the policy file .*bad.toml.*namespaces"):
        load(bad)
    bad.write_text('gpu = "eight"\n')
    with pytest.raises(PolicyError, match=r"gpu: in the policy file .* must be an integer"):
        load(bad)
    bad.write_text("targets = [\n")
    with pytest.raises(PolicyError, match="not valid TOML"):
        load(bad)
    with pytest.raises(PolicyError, match="cannot read the policy file"):
        load(tmp_path / "missing.toml")
    # TORCHSTEP_POLICY names the deployment's file; without it, DEFAULT
    good = tmp_path / "good.toml"
    good.write_text('namespaces = ["ml"]\n')
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)
    assert resolve() is DEFAULT
    monkeypatch.setenv("TORCHSTEP_POLICY", str(good))
    assert resolve().namespaces == ("ml",) and resolve(DEFAULT) is DEFAULT
    monkeypatch.setenv("TORCHSTEP_POLICY", str(tmp_path / "gone.toml"))
    with pytest.raises(PolicyError, match="cannot read"):  # fail closed: a named file that is gone stops every run
        resolve()
    assert os.environ["TORCHSTEP_POLICY"]


def test_a_policy_file_another_user_can_change_is_refused(tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text('namespaces = ["ml"]\n')
    path.chmod(0o644)
    assert load(path).namespaces == ("ml",)
    (tmp_path / "link.toml").symlink_to(path)  # a ConfigMap mounts its files as symlinks
    assert load(tmp_path / "link.toml").namespaces == ("ml",)
    path.chmod(0o666)
    with pytest.raises(PolicyError, match=r"can be changed by another user .*mode 0666.*fix: chown"):
        load(path)
    path.chmod(0o644)
    if os.geteuid() == 0:  # play another user: the file is theirs now
        os.chown(path, 12345, 12345)
        with pytest.raises(PolicyError, match="owner uid 12345"):
            load(path)
