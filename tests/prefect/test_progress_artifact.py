"""The Prefect artifacts of a step that reported progress or was stopped (issue 37 §1): the
ranks table says where each rank was when its agent stopped it, and a progress artifact
shows the lowest rank's last ``torchstep.progress()``. Unit level: Prefect's artifact
functions are recorded, not sent to a server (the served-flow tests cover the API)."""

from __future__ import annotations

from typing import Any

import pytest
from torchstep.result import RankResult, ReplicaResult, StepResult


def _result(progress: dict[str, Any] | None) -> StepResult:
    ranks = [
        RankResult("train", 0, 0, "CANCELLED", waiting_in="all_reduce", where="train.py:9 in step"),
        RankResult("train", 1, 1, "CANCELLED", where="train.py:42 in load_batch"),
    ]
    return StepResult("app-1", "CANCELLED", 143, replicas=[ReplicaResult("train", 0, ranks=ranks)], progress=progress)


def test_ranks_table_says_where_each_rank_was() -> None:
    from torchstep_prefect.artifacts import rank_rows

    rows = rank_rows(_result(None))
    assert [r["where"] for r in rows] == ["waiting in all_reduce", "train.py:42 in load_batch"]


@pytest.mark.parametrize(
    ("progress", "percent"),
    [
        ({"step": 120, "total": 1000, "rate": 2.0, "eta_s": 440.0, "rank": 0, "time": 1.0}, 12.0),
        ({"step": 7, "total": None, "rate": None, "eta_s": None, "rank": 0, "time": 1.0}, None),
        (None, None),
    ],
)
def test_progress_artifact(
    monkeypatch: pytest.MonkeyPatch, progress: dict[str, Any] | None, percent: float | None
) -> None:
    import prefect.artifacts
    from torchstep_prefect.artifacts import ArtifactSink

    made: list[tuple[str, dict[str, Any]]] = []
    for name in ("create_table_artifact", "create_markdown_artifact", "create_progress_artifact"):
        monkeypatch.setattr(prefect.artifacts, name, lambda _n=name, **kw: made.append((_n, kw)))
    ArtifactSink("train").result(_result(progress))
    got = [kw for n, kw in made if n == "create_progress_artifact"]
    if percent is None:
        assert got == []
    else:
        assert got[0]["progress"] == percent and got[0]["key"].endswith("progress")
        assert "step 120 of 1000" in got[0]["description"]
