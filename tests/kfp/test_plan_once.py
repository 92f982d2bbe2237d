"""Plan once per step (issue 34 item 3): the step a KFP container runs plans its AppDef for
the run target only, unless a run-time input differs from what the task was compiled with —
then the ``kfp`` plan is the check of the fields KFP fixed, and the step still runs."""

# No `from __future__ import annotations`: KFP reads annotations as types.
import json
from pathlib import Path
from typing import Any

import pytest
from plancount import count_plans

pytest.importorskip("kfp")
from torchstep_kfp import component_from_fn, entry  # noqa: E402

CKPT = f"{Path(__file__).resolve().parents[1] / 'apps' / 'steps.py'}:ckpt"


def argv(tmp_path: Path, op: Any, **inputs: Any) -> list[str]:
    """The container's argv for these input values (what KFP's launcher passes)."""
    args = op.component.component_spec.implementation.container.args
    executor_input = {
        "inputs": {"parameterValues": {"torchstep_job_id": "job-1"}},
        "outputs": {
            "parameters": {"result": {"outputFile": str(tmp_path / "result")}},
            "outputFile": str(tmp_path / "executor_output.json"),
        },
    }
    out = ["--spec", args[args.index("--spec") + 1], "--executor_input", json.dumps(executor_input)]
    for name, value in inputs.items():
        out += ["--in", name, value if isinstance(value, str) else json.dumps(value)]
    return out


def test_a_step_run_with_its_compiled_values_is_planned_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    marker = tmp_path / "ran"
    op = component_from_fn(CKPT, defaults={"marker": str(marker)})
    plans = count_plans(monkeypatch)
    assert entry.main(argv(tmp_path, op, **op.spec["planned_with"])) == 0
    assert marker.read_text() == "0.1\n"
    assert plans == [("ckpt", "local")]  # no second plan for target kfp
    assert json.loads((tmp_path / "result").read_text())["state"] == "SUCCEEDED"

    plans.clear()  # a run-time input that fixes nothing: checked against the compiled fields, then run
    assert entry.main(argv(tmp_path, op, **{**op.spec["planned_with"], "lr": 0.5})) == 0
    assert marker.read_text() == "0.1\n0.5\n"
    assert plans == [("ckpt", "kfp"), ("ckpt", "local")]
