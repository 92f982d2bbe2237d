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

    role = specs.Role("t", image="img:1", entrypoint="true", resource=specs.Resource(cpu=1, gpu=0, memMB=512),
                      max_retries=2, retry_policy=specs.RetryPolicy.APPLICATION)  # fmt: skip
    spec = compile_app(specs.AppDef("a", roles=[role]))
    (task,) = spec["root"]["dag"]["tasks"].values()
    assert task["retryPolicy"]["maxRetryCount"] == 2 and task["cachingOptions"] == {}
    role.metadata = {"torchstep": {"secret_env": {"TOKEN": "s/k"}}}
    if importlib.util.find_spec("kfp.kubernetes") is None:
        with pytest.raises(torchstep.SpecError, match=r"torchstep-kfp\[kubernetes\]"):
            compile_app(specs.AppDef("a", roles=[role]))
    else:
        compile_app(specs.AppDef("a", roles=[role]))
