"""``component_from_fn`` / ``component_from_app`` check their options when the component is
made (issue 24): each mistake is one line naming the option and the fix, and no component —
so no pipeline — exists."""

from pathlib import Path

import pytest
from optioncases import BAD_CFG
from torchstep import SpecError
from torchx import specs

pytest.importorskip("kfp")
from torchstep_kfp import component_from_app, component_from_fn  # noqa: E402

ECHO = f"{Path(__file__).resolve().parents[1] / 'apps' / 'steps.py'}:echo"


def app(replicas: int = 1, name: str = "train") -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    return specs.AppDef(name, roles=[role])


def refused(field: str, make) -> SpecError:
    with pytest.raises(SpecError) as err:
        make()
    assert err.value.field == field and err.value.fix, str(err.value)
    assert "\n" not in str(err.value)
    return err.value


@pytest.mark.parametrize(("target", "cfg", "field"), BAD_CFG)
def test_run_options_are_checked_for_the_steps_own_target(target, cfg, field):
    # a one-container step runs the local target in its container; a launcher step, Jobs
    refused(field, lambda: component_from_app(app(replicas=1 if target == "local" else 2), cfg=cfg))


@pytest.mark.parametrize(
    "make",
    [
        lambda: component_from_app(app(), caching="false"),
        lambda: component_from_fn(ECHO, caching="false"),
        lambda: component_from_app(app(), caching=1),
    ],
)
def test_caching_takes_only_a_bool(make):
    # "false" is truthy: it used to turn caching ON for a training step
    assert "True or False" in str(refused("caching", make))


def test_a_launcher_image_is_a_string():
    refused("launcher_image", lambda: component_from_app(app(replicas=2), launcher_image=["ghcr.io/acme/x:1"]))
    refused("launcher_image", lambda: component_from_app(app(replicas=2), launcher_image=" "))
    assert component_from_app(app(replicas=2), launcher_image="ghcr.io/acme/launch:1").name == "train"


def test_a_name_kfp_would_slug_to_almost_nothing_is_refused():
    err = refused("name", lambda: component_from_app(app(), name="ünï 名前"))
    assert "drops 'üï名前'" in err.problem
    refused("name (the default: the AppDef's or the function's name)", lambda: component_from_app(app(name="ünï")))
    assert component_from_app(app(name="ünï"), name="uni").name == "uni"
    assert component_from_app(app(), name="Train Model 2").name == "train-model-2"


def test_a_secret_looking_env_value_is_said_once_when_the_component_is_made(tmp_path):
    import uuid
    import warnings

    from kfp import compiler, dsl
    from torchstep.plan.secrets import InlinedSecretWarning

    a = app(name=f"sec-{uuid.uuid4().hex[:6]}")
    a.roles[0].env["HF_TOKEN"] = "hf_live_value_42"
    with pytest.warns(InlinedSecretWarning, match=r"roles\[0\]\.env\['HF_TOKEN'\].*the compiled pipeline.*secret_env"):
        op = component_from_app(a)

    @dsl.pipeline
    def pipeline():
        op()

    out = tmp_path / "p.yaml"
    with warnings.catch_warnings():
        warnings.simplefilter("error", InlinedSecretWarning)  # once per step: compiling it says nothing new
        compiler.Compiler().compile(pipeline, str(out))
    assert "hf_live_value_42" in out.read_text()  # what it warned about: the value is in the YAML
