"""The step's progress in KFP's Metrics artifact, at the sink (the kfp.local run of the same
is in test_local_runs.py): which names appear for what a step reported, that a rank-0 metric
of the same name wins, and that a component without a Metrics output gets none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kfp")
from torchstep.adapter import publish  # noqa: E402
from torchstep.result import StepResult  # noqa: E402
from torchstep_kfp.entry import ExecutorOutputSink, progress_metrics  # noqa: E402


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        (
            {"step": 120, "total": 1000, "rate": 4.0, "eta_s": 220.0, "rank": 0},
            {
                "progress_step": 120,
                "progress_total": 1000,
                "progress_percent": 12.0,
                "progress_rate": 4.0,
                "progress_eta_s": 220.0,
            },
        ),
        ({"step": 7, "total": None, "rate": None, "eta_s": None}, {"progress_step": 7}),  # no total: no percent
        (
            {"step": 3, "total": 9, "rate": None, "eta_s": None},
            {"progress_step": 3, "progress_total": 9, "progress_percent": 33.33},
        ),
        ({"step": True, "total": 2}, {}),  # not a number
        ({"step": float("nan"), "total": 2}, {}),
        (None, {}),
    ],
)
def test_progress_metrics(progress: Any, expected: dict[str, float]) -> None:
    assert progress_metrics(progress) == expected


def _executor_input(tmp_path: Path, metrics: bool) -> dict[str, Any]:
    outputs: dict[str, Any] = {
        "parameters": {"result": {"outputFile": str(tmp_path / "result")}},
        "outputFile": str(tmp_path / "executor_output.json"),
    }
    if metrics:
        outputs["artifacts"] = {
            "metrics": {"artifacts": [{"name": "m", "uri": str(tmp_path / "metrics"), "metadata": {}}]}
        }
    return {"outputs": outputs}


def test_a_rank_0_metric_of_the_same_name_wins_and_the_rest_is_added(tmp_path: Path) -> None:
    sink = ExecutorOutputSink({"metrics": True}, _executor_input(tmp_path, metrics=True))
    result = StepResult(
        "a",
        "SUCCEEDED",
        0,
        outputs={"metrics": {"loss": 0.5, "progress_step": 99}},
        progress={"step": 10, "total": 20, "rate": 2.0, "eta_s": 5.0, "rank": 0},
    )
    publish(result, sink)
    art = sink.executor_output["artifacts"]["metrics"]["artifacts"][0]
    assert art["metadata"] == {
        "loss": 0.5,
        "progress_step": 99,
        "progress_total": 20.0,
        "progress_percent": 50.0,
        "progress_rate": 2.0,
        "progress_eta_s": 5.0,
    }
    assert json.loads((tmp_path / "metrics").read_text()) == art["metadata"]  # the artifact's file too


def test_without_a_metrics_output_the_progress_is_only_in_the_result(tmp_path: Path) -> None:
    sink = ExecutorOutputSink({}, _executor_input(tmp_path, metrics=False))
    publish(StepResult("a", "SUCCEEDED", 0, progress={"step": 1, "total": 2, "rate": None, "eta_s": None}), sink)
    assert "artifacts" not in sink.executor_output
    assert sink.executor_output["parameterValues"]["result"]["progress"]["step"] == 1
