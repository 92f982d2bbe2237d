"""The local run option ``checkpoint_dir`` through a KFP step's ``cfg`` under kfp.local
(SubprocessRunner): every rank of the step gets the directory, and a step that an earlier
try left a checkpoint for resumes from it (docs/local.md, "Resuming after a crash")."""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.
from pathlib import Path

import pytest

kfp = pytest.importorskip("kfp")
from kfp import dsl, local  # noqa: E402
from torchstep_kfp import component_from_app  # noqa: E402
from torchx import specs  # noqa: E402

RESUMABLE = str(Path(__file__).resolve().parents[1] / "local" / "scripts" / "resumable.py")


@pytest.fixture
def kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    yield tmp_path
    local.config.LocalExecutionConfig.instance = None


def test_the_checkpoint_dir_in_the_step_cfg_reaches_the_ranks_and_training_resumes(kfp_local: Path) -> None:
    ckpt = kfp_local / "ckpt {{$.inputs.parameters['x']}} $(id)"  # data, not a placeholder or shell text
    ckpt.mkdir(mode=0o700)
    (ckpt / "epoch-004").write_text("4")  # what an earlier try saved before its launcher died
    role = specs.Role(
        "trainer",
        image="python:3.11",
        entrypoint="python",
        args=[RESUMABLE, "--epochs", "7", "--epoch-s", "0"],
        metadata={"torchstep": {"nproc_per_node": 2}},
    )
    train = component_from_app(specs.AppDef("resume", roles=[role]), cfg={"checkpoint_dir": str(ckpt)})

    @dsl.pipeline
    def pipe() -> dict:
        return train().outputs["result"]

    result = pipe().output
    assert result["state"] == "SUCCEEDED"
    assert result["outputs"] == {"first_epoch": 5}  # resumed after the saved epoch 4
    assert sorted(p.name for p in ckpt.iterdir()) == ["epoch-004", "epoch-005", "epoch-006"]
