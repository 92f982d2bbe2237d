"""The examples, run as their docs say (from the repository root, in a user's environment:
no PREFECT_* or AIRFLOW_* settings), print what happened and nothing that is not the
user's business: no warning about a "non-Python base image" from kfp.local, no telemetry
traceback ("database is locked") from Prefect's temporary server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def user_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_"))}
    env.update({"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "TMPDIR": str(tmp_path)})
    return env


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_prefect_example_runs_quietly_on_its_temporary_server(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "dags/prefect/train_flow.py"],
        cwd=ROOT,
        env=user_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=540,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Starting temporary server" in out and "SUCCEEDED, loss" in out
    for noise in ("database is locked", "Traceback", "| ERROR", "send_telemetry_heartbeat"):
        assert noise not in out, f"{noise!r} in the output:\n{out[-6000:]}"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_kfp_local_example_does_not_warn_about_images(tmp_path: Path) -> None:
    argv = [sys.executable, "dags/kfp/run_local.py", "--pipeline-root", str(tmp_path / "root"), "--steps", "10"]
    proc = subprocess.run(argv, cwd=ROOT, env=user_env(tmp_path), capture_output=True, text=True, timeout=540)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "pipeline output: train-" in out
    for noise in ("RuntimeWarning", "non-Python base image", "Traceback"):
        assert noise not in out, f"{noise!r} in the output:\n{out[-6000:]}"
