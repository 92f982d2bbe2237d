"""torchstep_kfp.apply_plan on a task the user built: compiled with the real KFP compiler,
the IR carries every plan field natively."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torchstep
import yaml
from torchx import specs

kfp = pytest.importorskip("kfp")
from kfp import compiler, dsl  # noqa: E402
from torchstep_kfp import apply_plan  # noqa: E402


def app(**role_kw: Any) -> specs.AppDef:
    metadata = role_kw.pop("metadata", {})
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        resource=role_kw.pop("resource", specs.Resource(cpu=2, gpu=1, memMB=4096)),
        env={"LR": "0.1", "SHELLY": "$(touch x); `y` {{ ds }}"},
        metadata=metadata,
        **role_kw,
    )
    return specs.AppDef("train", roles=[role], metadata={"torchstep.timeout": "3600"})


@dsl.container_component
def train_op():
    return dsl.ContainerSpec(image="ghcr.io/acme/train:1", command=["python", "-m", "train"])


def compile_with(tmp_path: Path, the_app: Any, **kw: Any) -> list[dict[str, Any]]:
    @dsl.pipeline(name="p")
    def pipeline():
        apply_plan(train_op(), the_app, **kw)

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    return list(yaml.safe_load_all(out.read_text()))


def test_every_plan_field_is_compiled_natively(tmp_path: Path) -> None:
    the_app = app(
        max_retries=3,
        retry_policy=specs.RetryPolicy.APPLICATION,
        mounts=[specs.VolumeMount(src="datasets", dst_path="/data")],
        metadata={
            "torchstep": {
                "retry_delay": 30,
                "retry_backoff": 2,
                "max_retry_delay": 300,
                "secret_env": {"HF_TOKEN": "hf-secret/token"},
            }
        },
    )
    the_app.roles[0].resource = specs.Resource(
        cpu=2, gpu=1, memMB=4096, capabilities={"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    )
    docs = compile_with(tmp_path, the_app)
    spec, platform = docs[0], docs[1]
    (task,) = spec["root"]["dag"]["tasks"].values()
    assert task["taskInfo"]["name"] == "train"
    assert task["cachingOptions"] == {}  # caching off: training has side effects
    assert task["retryPolicy"] == {
        "maxRetryCount": 3,
        "backoffDuration": "30s",
        "backoffFactor": 2.0,
        "backoffMaxDuration": "300s",
    }
    (executor,) = spec["deploymentSpec"]["executors"].values()
    container = executor["container"]
    res = container["resources"]
    assert (res["resourceCpuLimit"], res["resourceCpuRequest"]) == ("2", "2")
    assert (res["resourceMemoryLimit"], res["resourceMemoryRequest"]) == ("4096Mi", "4096Mi")
    assert res["accelerator"]["resourceType"] == "nvidia.com/gpu" and res["accelerator"]["resourceCount"] == "1"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env == {"LR": "0.1", "SHELLY": "$(touch x); `y` {{ ds }}"}  # verbatim, never a template
    k8s = next(iter(platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()))
    assert k8s["pvcMount"][0]["mountPath"] == "/data"
    assert k8s["secretAsEnv"][0]["secretName"] == "hf-secret"
    assert k8s["secretAsEnv"][0]["keyToEnv"] == [{"secretKey": "token", "envVar": "HF_TOKEN"}]
    assert k8s["nodeSelector"]["labels"] == {"node.kubernetes.io/instance-type": "p4d.24xlarge"}
    assert k8s["activeDeadlineSeconds"] == "3600"
    assert k8s["fieldPathAsEnv"] == [{"name": "TORCHSTEP_POD_NAME", "fieldPath": "metadata.name"}]
    text = (tmp_path / "p.yaml").read_text()
    assert "hf-secret" in text and "token" in text  # by reference only


def test_caching_can_be_turned_on_and_no_retries_means_no_retry_policy(tmp_path: Path) -> None:
    docs = compile_with(tmp_path, app(), caching=True)
    (task,) = docs[0]["root"]["dag"]["tasks"].values()
    assert task["cachingOptions"] == {"enableCache": True}
    assert "retryPolicy" not in task


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"mounts": [specs.BindMount(src_path="/x", dst_path="/y")]}, "roles[0].mounts[0]"),
        ({"mounts": [specs.DeviceMount(src_path="/dev/fuse", dst_path="/dev/fuse")]}, "roles[0].mounts[0]"),
        ({"port_map": {"http": 8080}}, "roles[0].port_map['http']"),
    ],
)
def test_what_kfp_cannot_express_is_a_spec_error_naming_the_field(tmp_path: Path, kw: dict, field: str) -> None:
    with pytest.raises(torchstep.SpecError) as err:
        compile_with(tmp_path, app(**kw))
    assert err.value.field == field and "fix" in str(err.value)


def test_a_plan_for_another_target_or_a_missing_role_is_refused(tmp_path: Path) -> None:
    with pytest.raises(torchstep.SpecError):
        compile_with(tmp_path, torchstep.build_plan(app(), "local"))
    with pytest.raises(torchstep.SpecError) as err:
        compile_with(tmp_path, app(), role="evaluator")
    assert err.value.field == "role"


def test_the_container_check_made_once_gives_the_ir_kfps_own_checks_give(tmp_path: Path, monkeypatch) -> None:
    """apply_plan lets KFP's set_* skip their inspect.stack() check (made once instead): the
    compiled pipeline is byte for byte the one the plain calls give, and the task is left
    as KFP made it (the user's own set_* calls afterwards check as usual)."""
    import contextlib

    from torchstep_kfp import tasks

    the_app = app(
        max_retries=2,
        retry_policy=specs.RetryPolicy.APPLICATION,
        mounts=[specs.VolumeMount(src="datasets", dst_path="/data")],
    )
    fast = compile_with(tmp_path, the_app)
    monkeypatch.setattr(tasks, "_container_checked", lambda task: contextlib.nullcontext())
    plain = compile_with(tmp_path, the_app)
    assert fast == plain and fast[0]["deploymentSpec"]["executors"]
    monkeypatch.undo()

    seen: list[Any] = []

    @dsl.pipeline(name="p")
    def pipeline():
        task = apply_plan(train_op(), the_app)
        seen.append("_ensure_container_spec_exists" in vars(task))

    compiler.Compiler().compile(pipeline, str(tmp_path / "q.yaml"))
    assert seen == [False]


def test_a_task_without_a_container_is_refused_naming_it(tmp_path: Path) -> None:
    @dsl.pipeline(name="inner")
    def inner():
        train_op()

    with pytest.raises(torchstep.SpecError) as err:

        @dsl.pipeline(name="p")
        def pipeline():
            apply_plan(inner(), app())

    assert err.value.field == "task" and "container" in str(err.value)
