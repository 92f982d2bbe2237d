"""`make demo`'s quick mode: the batch-training pipeline on Airflow, KFP and Prefect with
faults injected — every expectation holds (exit 0), the table names all three, no orphans;
the table explains itself (a legend line per column, the root cause wrapped at words), a
long wait prints progress when the output is not a terminal, and the logs are laid out as
``<orchestrator>/<scenario>/<step>/try<N>`` with an index and the orchestrators' own logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ("steps", "restarts", "retries", "wall (s)", "accuracy", "orphans", "root cause")
#: The demo prints a progress line every 10 s of a long wait; a gap above this fails.
MAX_SILENCE_S = 15.0


def run_demo(state: Path) -> tuple[int, list[tuple[float, str]], str]:
    """The quick demo with its output piped (not a terminal): every line with its arrival time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_"))}
    proc = subprocess.Popen(
        [sys.executable, "dags/demo.py", "--quick", "--state", str(state)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stderr: list[str] = []
    reader = threading.Thread(target=lambda: stderr.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]  # type: ignore[union-attr]
    proc.wait(timeout=1400)
    reader.join(timeout=10)
    return proc.returncode, lines, "".join(stderr)


def table_rows(text: str) -> dict[str, list[str]]:
    """The table's rows by orchestrator, a cell wrapped over several lines joined again."""
    rows: dict[str, list[str]] = {}
    last = ""
    for line in text.split("faults injected and survived", 1)[1].splitlines():
        if not line.startswith("│"):
            continue
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[0]:
            last = cells[0]
            rows[last] = cells[1:]
        else:  # a wrapped cell continues on this line
            rows[last] = [f"{a} {b}".strip() for a, b in zip(rows[last], cells[1:], strict=True)]
    return rows


@pytest.mark.slow(seconds=600)
@pytest.mark.timeout(1500)
def test_the_quick_demo_survives_every_fault_on_all_three_orchestrators(tmp_path: Path) -> None:
    code, lines, stderr = run_demo(tmp_path)
    text = "\n".join(line for _, line in lines)
    assert code == 0, text[-6000:] + stderr[-4000:]

    rows = table_rows(text)
    assert set(rows) == {"airflow", "kfp", "prefect"}
    for name, (steps, restarts, retries, _wall, accuracy, orphans, root_cause) in rows.items():
        assert steps == "3" and restarts == "1" and retries == "1" and orphans == "0", (name, rows[name])
        assert float(accuracy) > 0.55, (name, rows[name])
        # whole, wrapped at words: never cut mid-word
        assert root_cause == "NonRetryableError: --non-retryable: a bad configuration, retrying cannot help", root_cause

    # every column is explained under the table
    legend = text.split("└", 1)[1]
    for column in COLUMNS:
        assert re.search(rf"^\s+{re.escape(column)}\s+\S", legend, re.M), f"no legend line for {column!r}:\n{legend}"
    assert "publish_model" in legend  # why Airflow's DAG has a fourth task that is not a step

    # not a terminal: a long wait is never silent for long
    gaps = [(b - a, line) for (a, _), (b, line) in zip(lines, lines[1:])]
    longest = max(gaps)
    assert longest[0] <= MAX_SILENCE_S, f"{longest[0]:.0f} s without output before {longest[1]!r}"
    assert any("still running" in line for _, line in lines)

    # the logs: <orchestrator>/<scenario>/<step>/try<N>, an index, the orchestrators' own logs
    logs = tmp_path / "logs"
    assert f"logs: {logs}" in text and str(logs / "INDEX.md") in text
    index = (logs / "INDEX.md").read_text()
    entries = [row.strip("|").split("|") for row in index.splitlines() if re.match(r"\| (airflow|kfp|prefect) ", row)]
    listed = {tuple(c.strip() for c in e[:4]) for e in entries}
    for name in ("airflow", "kfp", "prefect"):
        for scenario in ("faults", "non-retryable", "cancel"):
            own = logs / name / scenario / f"{name}.log"
            assert own.stat().st_size > 0, f"{own} is empty"
            for step in ("prepare", "train") + (("evaluate",) if scenario == "faults" else ()):
                assert (name, scenario, step, "1") in listed, (name, scenario, step, index)
                assert (logs / name / scenario / step / "try1" / step).is_dir(), (name, scenario, step)
        # the retried prepare: both tries kept, in order
        first = json.loads((logs / name / "faults" / "prepare" / "try1" / "result.json").read_text())
        second = json.loads((logs / name / "faults" / "prepare" / "try2" / "result.json").read_text())
        assert (first["state"], second["state"]) == ("FAILED", "SUCCEEDED"), name
        # the orchestrator's log holds its task logs: the ranks' own lines
        assert "[train/" in (logs / name / "faults" / f"{name}.log").read_text(), name
    leftovers = [p.name for p in logs.iterdir() if p.name not in ("INDEX.md", "airflow", "kfp", "prefect")]
    assert not leftovers, leftovers


def test_the_readme_shows_the_demos_legend_and_columns() -> None:
    """The README's copy of the demo's table explains the same columns in the same words."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", ROOT / "dags" / "demo.py")
    demo = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(demo)  # type: ignore[union-attr]
    readme = (ROOT / "README.md").read_text()
    assert demo.LEGEND in readme
    for column in COLUMNS:
        assert re.search(rf"^\s+{re.escape(column)}\s+\S", demo.LEGEND, re.M), column
    header = next(line for line in readme.splitlines() if line.startswith("┃ orchestrator"))
    assert [c.strip() for c in header.split("┃")[1:-1]] == ["orchestrator", *COLUMNS[:-1], "non-retryable root cause"]
