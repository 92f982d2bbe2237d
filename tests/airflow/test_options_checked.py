"""``AppDefOperator`` checks its options when the DAG file is parsed (issue 24): each
mistake is one line naming the option and the fix — a DAG import error, never a failed run;
a templated value is checked once rendered, its key at once."""

from __future__ import annotations

import pytest
from optioncases import BAD_CFG
from torchstep import SpecError
from torchstep_airflow import AppDefOperator
from torchx import specs


def app() -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    return specs.AppDef("train", roles=[role])


@pytest.mark.parametrize(("target", "cfg", "field"), BAD_CFG)
def test_run_options_are_checked_when_the_operator_is_made(target, cfg, field):
    with pytest.raises(SpecError) as err:
        AppDefOperator(task_id="t", app=app(), target=target, cfg=cfg)
    assert err.value.field == field and err.value.fix and "\n" not in str(err.value)


def test_a_templated_value_waits_for_rendering_but_its_key_is_checked_now():
    op = AppDefOperator(task_id="t", app=app(), cfg={"timeout": "{{ params.timeout }}"})
    assert op.cfg == {"timeout": "{{ params.timeout }}"}
    with pytest.raises(SpecError, match=r"cfg\['timout'\].*unknown option"):
        AppDefOperator(task_id="t", app=app(), cfg={"timout": "{{ params.timeout }}"})


def test_retries_must_be_a_whole_number():
    with pytest.raises(SpecError, match=r"^retries \(target 'local'\): the task's retries must be a whole number"):
        AppDefOperator(task_id="t", app=app(), retries=-1)


def test_a_secret_looking_env_value_is_said_when_the_dag_is_parsed():
    import uuid

    from torchstep.plan.secrets import InlinedSecretWarning

    a = app()
    a.name = f"sec-{uuid.uuid4().hex[:6]}"
    a.roles[0].env["WANDB_API_KEY"] = "wandb_live_value_42"
    with pytest.warns(
        InlinedSecretWarning, match=r"env\['WANDB_API_KEY'\].*Airflow's rendered fields.*secret_env"
    ) as w:
        AppDefOperator(task_id="k", app=a, target="kubernetes")
    assert "wandb_live_value_42" not in str(w[0].message)
