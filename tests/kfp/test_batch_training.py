"""dags/kfp/batch_training.py: compiles, and under kfp.local (small sizes, faults injected)
the step that fails once is retried exactly once, the killed rank costs one restart round
and training resumes at its epoch, results and the Metrics/Model artifacts reach
downstream, the model beats chance."""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

kfp = pytest.importorskip("kfp")
from kfp import local  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "dags" / "kfp" / "batch_training.py"


def test_the_batch_pipeline_compiles_with_metrics_and_model_artifacts(tmp_path: Path) -> None:
    out = tmp_path / "batch.yaml"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--compile", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    import yaml

    spec = next(yaml.safe_load_all(out.read_text()))
    artifacts = spec["components"]["comp-train"]["outputDefinitions"]["artifacts"]
    assert {k: v["artifactType"]["schemaTitle"] for k, v in artifacts.items()} == {
        "metrics": "system.Metrics",
        "model_artifact": "system.Model",
    }
    assert set(spec["root"]["dag"]["tasks"]) == {"prepare", "train", "evaluate"}


def test_faults_are_survived_under_kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    monkeypatch.chdir(ROOT)
    root = tmp_path / "root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    try:
        spec = importlib.util.spec_from_file_location("kfp_batch_training", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # defined after local.init: the lightweight form
        run = module.batch_training(
            workdir=str(tmp_path / "work"), samples=800, epochs=3, kill_rank=1, kill_at_epoch=1, fail_once=True
        )
    finally:
        local.config.LocalExecutionConfig.instance = None
    out = capfd.readouterr().out
    assert out.count("torchstep: try 1 of 2 failed") == 1  # prepare: one retry, exactly
    (train_dir,) = root.glob("batch-training-*/train")
    result = json.loads((train_dir / "result").read_text())
    history = result["outputs"]["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2] and result["outputs"]["first_epoch"] == 1
    assert [h["restart"] for h in history] == [0, 1, 1]  # one restart round of the agent
    executor_output = json.loads((train_dir / "executor_output.json").read_text())
    assert executor_output["artifacts"]["metrics"]["artifacts"][0]["metadata"]["accuracy"] > 0.5
    assert (train_dir / "model_artifact").stat().st_size > 0
    assert run.output > 0.25 + 0.4  # held-out accuracy well beyond chance (4 classes)
