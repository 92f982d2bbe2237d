"""``app_task`` checks its options when the task is made (issue 24): each mistake is one
line naming the option and the fix, and no task exists to run."""

import pytest
from optioncases import BAD_CFG
from torchstep import SpecError
from torchx import specs

pytest.importorskip("prefect")
from torchstep_prefect import app_task  # noqa: E402


def app(replicas: int = 1) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    return specs.AppDef("train", roles=[role])


@pytest.mark.parametrize(("target", "cfg", "field"), BAD_CFG)
def test_run_options_are_checked_when_the_task_is_made(target, cfg, field):
    with pytest.raises(SpecError) as err:
        app_task(app(), target=target, cfg=cfg)
    assert err.value.field == field and err.value.fix and "\n" not in str(err.value)


@pytest.mark.parametrize("retries", [-1, 1.5, "2", True])
def test_retries_must_be_a_whole_number(retries):
    with pytest.raises(SpecError, match=r"^retries \(target 'local'\): the task's retries must be a whole number"):
        app_task(app(), retries=retries)
