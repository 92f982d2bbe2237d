"""The KFP adapter installs alone (with the newest kfp its range allows) and imports
without pulling in torch, Airflow or Prefect."""

import subprocess
import sys


def test_import_is_light_and_kfp_is_installed():
    code = (
        "import sys, importlib.metadata as md, torchstep_kfp;"
        "bad = sorted(m for m in ('torch', 'airflow', 'prefect') if m in sys.modules);"
        "print(','.join(bad) or 'clean', md.version('kfp'))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out[0] == "clean", f"importing torchstep_kfp pulled in: {out[0]}"
    major = int(out[1].split(".")[0])
    assert major == 2, f"torchstep-kfp targets KFP v2, found kfp {out[1]}"


def test_core_plans_for_the_kfp_target():
    import torchstep

    plan = torchstep.build_plan(torchstep.materialize("utils.echo", ["--msg", "hi"]), target="kfp")
    assert plan.target == "kfp"
    assert plan.roles[0].argv == ["echo", "hi"]


def test_apply_plan_compiles_with_whatever_kfp_this_environment_has(tmp_path):
    """The newest kfp the range allows compiles what apply_plan sets; kfp-kubernetes is
    an extra: without it, a plan that needs it is a SpecError naming the fix."""
    import importlib.util

    import pytest
    import torchstep
    import yaml
    from kfp import compiler, dsl
    from torchstep_kfp import apply_plan
    from torchx import specs

    @dsl.container_component
    def op():
        return dsl.ContainerSpec(image="img:1", command=["true"])

    def compile_app(app):
        @dsl.pipeline(name="p")
        def pipeline():
            apply_plan(op(), app)

        compiler.Compiler().compile(pipeline, str(tmp_path / "p.yaml"))
        return next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))

    role = specs.Role(
        "t",
        image="img:1",
        entrypoint="true",
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
        max_retries=2,
        retry_policy=specs.RetryPolicy.APPLICATION,
    )
    spec = compile_app(specs.AppDef("a", roles=[role]))
    (task,) = spec["root"]["dag"]["tasks"].values()
    assert task["retryPolicy"]["maxRetryCount"] == 2 and task["cachingOptions"] == {}
    role.metadata = {"torchstep": {"secret_env": {"TOKEN": "s/k"}}}
    if importlib.util.find_spec("kfp.kubernetes") is None:
        with pytest.raises(torchstep.SpecError, match=r"torchstep-kfp\[kubernetes\]"):
            compile_app(specs.AppDef("a", roles=[role]))
    else:
        compile_app(specs.AppDef("a", roles=[role]))


def test_components_compile_with_whatever_kfp_this_environment_has(tmp_path):
    """component_from_fn / component_from_app build real KFP components with the newest kfp
    the range allows: typed inputs from the signature, the entry point as the command."""
    import json

    import yaml
    from kfp import compiler, dsl
    from torchstep_kfp import component_from_app, component_from_fn
    from torchx import specs

    echo = component_from_fn("utils.echo", outputs={"said": str})
    fixed = component_from_app(
        specs.AppDef("a", roles=[specs.Role("a", image="img:1", entrypoint="echo", args=["{{x}}"])])
    )

    @dsl.pipeline(name="p")
    def pipeline(msg: str = "hi"):
        echo(msg=msg)
        fixed()

    compiler.Compiler().compile(pipeline, str(tmp_path / "p.yaml"))
    spec = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    inputs = spec["components"]["comp-echo"]["inputDefinitions"]["parameters"]
    assert inputs["msg"]["parameterType"] == "STRING" and inputs["num_replicas"]["parameterType"] == "NUMBER_INTEGER"
    container = spec["deploymentSpec"]["executors"]["exec-echo"]["container"]
    assert container["command"] == ["python3", "-m", "torchstep_kfp.entry"]
    assert "{{$.inputs.parameters['msg']}}" in container["args"]
    args = spec["deploymentSpec"]["executors"]["exec-a"]["container"]["args"]
    assert json.loads(args[args.index("--spec") + 1])["app"]["roles"][0]["args"] == ["{{x}}"]
