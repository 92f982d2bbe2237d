"""Plan once per step (issue 34 item 3), on Airflow's side: the ``airflow`` TorchX
scheduler's dry run checks the AppDef for the conf and the step's run options with one
plan; the generic DAG's task plans the AppDef it received once."""

from pathlib import Path

import pytest
from plancount import count_plans
from torchstep import SpecError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def runner(tmp_path, monkeypatch):
    from torchx.runner import get_runner

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    r = get_runner()
    yield r
    r.close()


def test_the_schedulers_dry_run_plans_the_app_once(runner, monkeypatch) -> None:
    plans = count_plans(monkeypatch)
    info = runner.dryrun_component(
        "utils.echo",
        ["--msg", "x"],
        scheduler="airflow",
        cfg={"endpoint": "http://127.0.0.1:9", "step_cfg": {"timeout": "60"}},
    )
    assert info.request.body["conf"]["cfg"] == {"timeout": "60"}  # the run options, checked and sent
    assert plans == [("echo", "local")]
    plans.clear()
    with pytest.raises(SpecError, match=r"cfg\['step_cfg'\]\['bogus'\]"):  # still checked, still once
        runner.dryrun_component(
            "utils.echo",
            ["--msg", "x"],
            scheduler="airflow",
            cfg={"endpoint": "http://127.0.0.1:9", "step_cfg": {"bogus": "1"}},
        )
    assert plans == [("echo", "local")]
