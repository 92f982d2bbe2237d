"""Plan once per step (issue 34 item 3), in real Prefect flows: the generic flow plans the
AppDef it received once (on arrival, where the policy checks it) and runs that plan;
``app_task`` plans when the task is defined and runs that plan for a call with the values
it was planned with, and plans a call with other values once."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
import sys
from pathlib import Path

import pytest
from plancount import count_plans
from torchstep.components.appjson import app_to_dict
from torchx import specs

pytest.importorskip("prefect")
from prefect import flow  # noqa: E402
from torchstep_prefect import app_task  # noqa: E402
from torchstep_prefect.torchx_flow import torchx_app  # noqa: E402

ECHO = f"{Path(__file__).resolve().parents[1] / 'apps' / 'steps.py'}:echo"
pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)


def test_the_generic_flow_plans_the_app_it_received_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    app = specs.AppDef("hello", roles=[specs.Role("w", image="x", entrypoint=sys.executable, args=["-c", code])])
    plans = count_plans(monkeypatch)
    state = torchx_app(app=app_to_dict(app), target="local", return_state=True)
    assert state.is_completed(), state
    assert marker.read_text() == "ran"
    assert plans == [("hello", "local")]


def test_app_task_plans_when_defined_and_once_per_call_with_other_values(monkeypatch: pytest.MonkeyPatch) -> None:
    plans = count_plans(monkeypatch)
    echo = app_task(ECHO, defaults={"lr": 0.2})
    assert plans == [("echo", "local")]

    @flow
    def pipeline(lr: float) -> dict:
        return echo(lr=lr)

    plans.clear()
    assert pipeline(lr=0.2)["outputs"]["lr"] == 0.2  # the values it was planned with: that plan runs
    assert plans == []
    assert pipeline(lr=0.7)["outputs"]["lr"] == 0.7  # other values: planned once, for this call
    assert plans == [("echo", "local")]
