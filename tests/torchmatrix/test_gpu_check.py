"""bench/gpu.sh's dry mode (gloo on the CPU, no GPU asserts), with the repository's Python
standing in for the GPU machine's: the script installs the torchstep wheel it builds with
``pip install --no-index --no-deps --target``, runs the agent against torchrun, checks and
times what the GPU run checks and times, and writes its JSON and its section — so the one
command a GPU machine gets is known to work before a GPU is at hand."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_gpu_check_runs_dry_and_every_check_passes(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "performance.md").read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHSTEP_", "PET_", "TORCHELASTIC_"))}
    env.update(PYTHON=sys.executable, GPU_WHEELS=str(tmp_path / "no-wheels"), OUT=str(tmp_path / "out"))
    done = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu.sh"), "--dry"], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "installed into" in done.stdout and "torchstep-" in done.stdout  # the wheel, not the source tree
    report = json.loads((tmp_path / "out" / "gpu.json").read_text())
    assert report["machine"]["dry"] is True
    assert set(report["checks"]) >= {
        "every run of the agent succeeded",
        "the agent's workers are forked from the zygote (torch preloaded, CUDA not initialised)",
        "CUDA_VISIBLE_DEVICES, LOCAL_RANK and the rest as torchrun sets them",
        "a rank SIGKILLed mid-step is restarted and trains",
    }
    assert set(report["checks"].values()) == {"pass"}, report["checks"]
    assert report["startup"]["torchstep-agent"] > 0 and report["recovery"]["torchstep-agent"] > 0
    agent_runs = [r for r in report["runs_detail"] if r["launcher"] == "torchstep-agent"]
    ranks = [k for r in agent_runs for k in r["ranks"]]
    assert ranks and all(k["preloaded"] and k["backend"] == "gloo" for k in ranks)
    section = (tmp_path / "out" / "gpu.md").read_text()
    assert section.startswith("## On a GPU\n") and "dry mode" in section and "| startup:" in section
    # the stacks and flight recorder step: a stuck rank cancelled, where it was in the result
    flight = json.loads((tmp_path / "out" / "gpu_flight.json").read_text())
    assert flight["dry"] is True and set(flight["checks"].values()) == {"pass"}, flight
    assert flight["stack"][0].endswith("in stuck") and flight["nccl_dumps"] == []
    assert (ROOT / "docs" / "performance.md").read_text() == doc  # the dry mode never writes the docs
