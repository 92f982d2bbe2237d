"""component_from_fn / component_from_app compiled with the real KFP compiler: typed inputs
from the component's signature, the executor's image/command/args with input
placeholders, every plan field on the task, the kfp-kubernetes platform spec, literal
``{{$.inputs…}}`` text kept verbatim, secrets by reference only, the launcher step of a
multi-node AppDef, and clear errors for what KFP cannot express."""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from torchstep import SpecError
from torchx import specs

kfp = pytest.importorskip("kfp")
pytest.importorskip("kfp.kubernetes")
from kfp import compiler, components, dsl  # noqa: E402
from torchstep_kfp import component_from_app, component_from_fn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parents[1] / "apps"
ECHO = f"{APPS / 'steps.py'}:echo"
NODES = f"{APPS / 'steps.py'}:nodes"


def compile_pipeline(tmp_path: Path, pipeline: Any) -> list[dict[str, Any]]:
    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    return list(yaml.safe_load_all(out.read_text()))


def only(mapping: dict[str, Any]) -> Any:
    (value,) = mapping.values()
    return value


def test_inputs_are_the_component_parameters_typed_with_defaults_and_descriptions() -> None:
    op = component_from_fn(ECHO)
    params = op.component.component_spec.inputs
    assert {k: (v.type, v.default, v.optional) for k, v in params.items() if not k.startswith("torchstep_")} == {
        "lr": ("Float", 0.1, True),
        "epochs": ("Integer", 2, True),
        "name": ("String", "run", True),
        "tags": ("List", None, True),
        "extra": ("Dict", None, True),
        "debug": ("Boolean", False, True),
        "image": ("String", "python:3.11", True),
    }
    assert params["lr"].description == "learning rate"
    assert params["tags"].description == "a list of tags"
    outputs = op.component.component_spec.outputs
    assert outputs["result"].type == "Dict"


def test_the_executor_runs_the_entry_point_with_every_input_as_a_placeholder(tmp_path: Path) -> None:
    op = component_from_fn(ECHO, outputs={"app_id": str}, metrics=True, model=True)

    @dsl.pipeline(name="p")
    def pipeline(lr: float = 0.5):
        op(lr=lr, tags=["a", "b"])

    spec, platform = compile_pipeline(tmp_path, pipeline)
    container = only(spec["deploymentSpec"]["executors"])["container"]
    assert container["image"] == "python:3.11"
    assert container["command"] == ["python3", "-m", "torchstep_kfp.entry"]
    args = container["args"]
    assert args[args.index("--executor_input") + 1] == "{{$}}"
    i = args.index("lr")
    assert args[i - 1 : i + 2] == ["--in", "lr", "{{$.inputs.parameters['lr']}}"]
    # an optional input is passed only when present
    assert {"IfPresent": {"InputName": "tags", "Then": ["--in", "tags", "{{$.inputs.parameters['tags']}}"]}} in [
        json.loads(a) for a in args if isinstance(a, str) and a.startswith('{"IfPresent"')
    ]
    step = json.loads(args[args.index("--spec") + 1])
    assert step["component"] == ECHO and step["outputs"] == {"app_id": "str"} and step["metrics"] and step["model"]
    comp = only(spec["components"])
    assert set(comp["outputDefinitions"]["parameters"]) == {"result", "app_id"}
    assert {k: v["artifactType"]["schemaTitle"] for k, v in comp["outputDefinitions"]["artifacts"].items()} == {
        "metrics": "system.Metrics",
        "model": "system.Model",
    }
    task = only(spec["root"]["dag"]["tasks"])
    assert task["inputs"]["parameters"]["lr"] == {"componentInputParameter": "lr"}
    # macros: KFP's run id reaches the step (with the pod's name: app_id differs per run, task and retry)
    assert task["inputs"]["parameters"]["torchstep_job_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    # a one-pod step creates no Jobs: it has no task-id input (its UI shows one hidden input less)
    assert "torchstep_task_id" not in task["inputs"]["parameters"]
    assert task["cachingOptions"] == {}  # caching off by default
    assert (
        container["resources"]["resourceCpuLimit"] == "1" and container["resources"]["resourceMemoryLimit"] == "256Mi"
    )
    executor = only(platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"])
    assert {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory"}.items() <= executor["emptyDirMounts"][
        0
    ].items()
    assert executor["fieldPathAsEnv"] == [{"name": "TORCHSTEP_POD_NAME", "fieldPath": "metadata.name"}]


def test_retries_env_secrets_pvcs_and_the_overlay_are_compiled_natively(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "s3cr3t-value-never-in-yaml")
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        resource=specs.Resource(cpu=4, gpu=2, memMB=8192, capabilities={"node.kubernetes.io/instance-type": "g5"}),
        env={"LOG_LEVEL": "info"},
        max_retries=2,
        retry_policy=specs.RetryPolicy.APPLICATION,
        mounts=[specs.VolumeMount(src="datasets", dst_path="/data")],
        metadata={
            "torchstep": {"retry_delay": 30, "retry_backoff": 2, "secret_env": {"HF_TOKEN": "hf-secret/token"}},
            "kubernetes": {
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "imagePullSecrets": [{"name": "regcred"}],
                "volumes": [
                    {"name": "cache", "emptyDir": {"sizeLimit": "10Gi"}},
                    {"name": "creds", "secret": {"secretName": "gcs-creds"}},
                ],
                "containers": [
                    {
                        "name": "main",
                        "volumeMounts": [
                            {"name": "cache", "mountPath": "/cache"},
                            {"name": "creds", "mountPath": "/creds"},
                        ],
                    }
                ],
            },
        },
    )
    op = component_from_app(specs.AppDef("train", roles=[role], metadata={"torchstep.timeout": "7200"}))

    @dsl.pipeline(name="p")
    def pipeline():
        op()

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    text = out.read_text()
    assert "s3cr3t-value-never-in-yaml" not in text
    spec, platform = yaml.safe_load_all(text)
    task = only(spec["root"]["dag"]["tasks"])
    assert task["retryPolicy"] == {  # no max_retry_delay: KFP's default cap
        "maxRetryCount": 2,
        "backoffDuration": "30s",
        "backoffFactor": 2.0,
        "backoffMaxDuration": "3600s",
    }
    container = only(spec["deploymentSpec"]["executors"])["container"]
    assert container["env"] == [{"name": "LOG_LEVEL", "value": "info"}]
    assert {"resourceType": "nvidia.com/gpu", "resourceCount": "2"}.items() <= container["resources"][
        "accelerator"
    ].items()
    ex = only(platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"])
    assert ex["secretAsEnv"][0]["keyToEnv"] == [{"secretKey": "token", "envVar": "HF_TOKEN"}]
    assert ex["pvcMount"][0]["mountPath"] == "/data"
    assert ex["nodeSelector"]["labels"] == {"node.kubernetes.io/instance-type": "g5"}
    assert ex["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert [s["secretName"] for s in ex["imagePullSecret"]] == ["regcred"]
    assert ex["secretAsVolume"][0]["mountPath"] == "/creds"
    assert {m["mountPath"] for m in ex["emptyDirMounts"]} == {"/cache", "/dev/shm"}
    assert ex["activeDeadlineSeconds"] == "7200"
    # the fixed AppDef travels to the step as data
    args = container["args"]
    assert json.loads(args[args.index("--spec") + 1])["app"]["roles"][0]["env"] == {"LOG_LEVEL": "info"}


def test_literal_placeholder_text_reaches_the_step_verbatim(tmp_path: Path) -> None:
    text = "{{$.inputs.parameters['lr']}} $(rm -rf /) `id` {{ ds }} python3"
    role = specs.Role("echo", image="python:3.11", entrypoint="echo", args=[text], env={"NOTE": text})
    op = component_from_app(specs.AppDef("echo", roles=[role]))
    op_fn = component_from_fn(ECHO)

    @dsl.pipeline(name="p")
    def pipeline():
        op()
        op_fn(name=text)

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    raw = out.read_text()
    # the only {{$.inputs...}} placeholders are the ones the components declare
    assert "{{$.inputs.parameters['lr']}} $(rm" not in raw
    spec = next(yaml.safe_load_all(raw))
    executors = spec["deploymentSpec"]["executors"]
    app_args = executors["exec-echo"]["container"]["args"]
    decoded = json.loads(app_args[app_args.index("--spec") + 1])
    assert decoded["app"]["roles"][0]["args"] == [text]
    # set_env_variable carries the env as a value (KFP does not resolve env values)
    assert executors["exec-echo"]["container"]["env"] == [{"name": "NOTE", "value": text}]
    constant = spec["root"]["dag"]["tasks"]["echo-2"]["inputs"]["parameters"]["name"]["runtimeValue"]["constant"]
    assert "{{" not in constant
    from torchstep_kfp.entry import _inputs

    assert _inputs({"inputs": {"name": "str"}}, [["name", constant]], local=False) == {"name": text}


def test_a_multi_node_app_compiles_to_a_launcher_step(tmp_path: Path) -> None:
    op = component_from_fn(NODES)

    @dsl.pipeline(name="p")
    def pipeline(replicas: int = 2):
        op(replicas=replicas)

    spec, platform = compile_pipeline(tmp_path, pipeline)
    container = only(spec["deploymentSpec"]["executors"])["container"]
    assert json.loads(container["args"][container["args"].index("--spec") + 1])["launcher"] is True
    assert container["image"] == "ghcr.io/acme/train:1"  # the launcher runs in the role's image (it has torchstep)
    assert container["resources"]["resourceCpuRequest"] == "100m"  # the launcher only watches Jobs
    assert "accelerator" not in container["resources"]
    task = only(spec["root"]["dag"]["tasks"])
    assert task["retryPolicy"]["maxRetryCount"] == 2
    # KFP's task id (one per task, the same for its retries): a retried launcher finds its Jobs
    assert task["inputs"]["parameters"]["torchstep_task_id"]["runtimeValue"]["constant"] == "{{$.pipeline_task_uuid}}"
    ex = only(platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"])
    assert {e["name"]: e["fieldPath"] for e in ex["fieldPathAsEnv"]} == {
        "TORCHSTEP_POD_NAME": "metadata.name",
        "TORCHSTEP_NAMESPACE": "metadata.namespace",
    }


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: component_from_fn(ECHO, nope=1), "nope"),
        (lambda: component_from_fn(ECHO, defaults={"lr": "fast"}), "defaults.lr"),
        (lambda: component_from_fn(ECHO, outputs={"result": str}), "outputs.result"),
        (lambda: component_from_fn(ECHO, outputs={"x": set}), "outputs.x"),
        (lambda: component_from_fn(ECHO, outputs={"lr": float}), "outputs.lr"),
        (lambda: component_from_fn(f"{APPS / 'steps.py'}:flaky"), "component.marker"),
        (lambda: component_from_app(_app(mounts=[specs.BindMount("/data", "/data")])), "roles[0].mounts[0]"),
        (lambda: component_from_app(_app(mounts=[specs.DeviceMount("/dev/fuse", "/dev/fuse")])), "roles[0].mounts[0]"),
        (lambda: component_from_app(_app(port_map={"tb": 6006})), "roles[0].port_map"),
        (
            lambda: component_from_app(_app(metadata={"kubernetes": {"hostNetwork": True}})),
            "roles[0].metadata['kubernetes']['hostNetwork']",
        ),
    ],
)
def test_what_kfp_cannot_express_is_a_spec_error_naming_the_field(build: Any, field: str, tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        op = build()

        @dsl.pipeline(name="p")
        def pipeline():
            op()

        compile_pipeline(tmp_path, pipeline)
    assert e.value.field.startswith(field), e.value
    assert e.value.fix


def _app(**role_kw: Any) -> specs.AppDef:
    return specs.AppDef("a", roles=[specs.Role("a", image="img:1", entrypoint="true", **role_kw)])


def test_the_compiled_yaml_loads_back_with_kfp(tmp_path: Path) -> None:
    op = component_from_fn(ECHO, metrics=True)

    @dsl.pipeline(name="p")
    def pipeline(lr: float = 0.5):
        op(lr=lr)

    compile_pipeline(tmp_path, pipeline)
    loaded = components.load_component_from_file(str(tmp_path / "p.yaml"))
    assert loaded.name == "p"
    assert "lr" in loaded.component_spec.inputs
    # the component is a real KFP component: it compiles alone and loads back (to share it as YAML)
    assert isinstance(op, dsl.base_component.BaseComponent)
    compiler.Compiler().compile(op, str(tmp_path / "c.yaml"))
    assert components.load_component_from_file(str(tmp_path / "c.yaml")).component_spec.inputs["lr"].default == 0.1


def test_kfp_dsl_compile_compiles_the_example_pipeline(tmp_path: Path) -> None:
    kfp_cli = Path(sys.executable).with_name("kfp")
    out = tmp_path / "train.yaml"
    proc = subprocess.run(
        [str(kfp_cli), "dsl", "compile", "--py", "dags/kfp/train_pipeline.py", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr
    spec, _ = yaml.safe_load_all(out.read_text())
    assert set(spec["root"]["dag"]["tasks"]) == {"prepare", "trainer", "evaluate"}
    trainer = spec["root"]["dag"]["tasks"]["trainer"]
    assert trainer["inputs"]["parameters"]["lr"]["taskOutputParameter"]["producerTask"] == "prepare"


def test_the_step_entry_point_imports_neither_kfp_nor_torch() -> None:
    """It runs in every step container: kfp's 1.6 s import and torch stay out of it."""
    code = "import sys, torchstep_kfp.entry; print(sorted(m for m in ('kfp', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_multi_role_app_is_one_launcher_step_too(tmp_path: Path) -> None:
    """Roles must start together (one rendezvous each): separate KFP tasks could not find
    each other, so several roles run as Jobs of one launcher step."""
    roles = [specs.Role(n, image="img:1", entrypoint="python", args=["-m", n]) for n in ("ps", "worker")]
    op = component_from_app(specs.AppDef("two", roles=roles))

    @dsl.pipeline(name="p")
    def pipeline():
        op()

    spec, _ = compile_pipeline(tmp_path, pipeline)
    args = only(spec["deploymentSpec"]["executors"])["container"]["args"]
    step = json.loads(args[args.index("--spec") + 1])
    assert step["launcher"] is True and [r["name"] for r in step["app"]["roles"]] == ["ps", "worker"]
