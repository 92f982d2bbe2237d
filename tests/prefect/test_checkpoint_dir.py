"""The local run option ``checkpoint_dir`` through a Prefect task's ``cfg``: every rank of
the step gets the directory, and a task that an earlier try left a checkpoint for resumes
from it (docs/local.md, "Resuming after a crash")."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
from pathlib import Path

import pytest

pytest.importorskip("prefect")
from prefect import flow  # noqa: E402
from torchstep_prefect import app_task  # noqa: E402
from torchx import specs  # noqa: E402

RESUMABLE = str(Path(__file__).resolve().parents[1] / "local" / "scripts" / "resumable.py")

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_the_checkpoint_dir_in_the_task_cfg_reaches_the_ranks_and_training_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ckpt = tmp_path / "ckpt {{ flow_run.id }} $(id)"  # data, not a template or shell text
    ckpt.mkdir(mode=0o700)
    (ckpt / "epoch-004").write_text("4")  # what an earlier try saved before its process died
    role = specs.Role(
        "trainer",
        image="",
        entrypoint="python",
        args=[RESUMABLE, "--epochs", "7", "--epoch-s", "0"],
        metadata={"torchstep": {"nproc_per_node": 2}},
    )
    train = app_task(specs.AppDef("resume", roles=[role]), cfg={"checkpoint_dir": str(ckpt)})

    @flow
    def pipeline() -> dict:
        return train()

    result = pipeline()
    assert result["state"] == "SUCCEEDED"
    assert result["outputs"] == {"first_epoch": 5}  # resumed after the saved epoch 4
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-004", "epoch-005", "epoch-006"]
