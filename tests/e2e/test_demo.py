"""`make demo`'s quick mode: the batch-training pipeline on Airflow, KFP and Prefect with
faults injected — every expectation holds (exit 0), the table names all three, no orphans."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_quick_demo_survives_every_fault_on_all_three_orchestrators(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_"))}
    proc = subprocess.run([sys.executable, "dags/demo.py", "--quick", "--state", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1400)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    table = proc.stdout.split("faults injected and survived", 1)[1]
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in table.splitlines() if line.startswith("│")}  # fmt: skip
    assert set(rows) == {"airflow", "kfp", "prefect"}
    for name, (steps, restarts, retries, _wall, accuracy, orphans, root_cause) in rows.items():
        assert restarts == "1" and retries == "1" and orphans == "0", (name, rows[name])
        assert float(accuracy) > 0.55 and "NonRetryableError" in root_cause, (name, rows[name])
