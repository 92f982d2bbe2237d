"""docs/airflow.md stays in step with the code: its translation tables are what
``torchstep.explain`` prints today for the example's train step, and its example DAG is the
one in dags/airflow. ``python tests/airflow/test_docs.py`` regenerates the tables."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "airflow.md"
DAGS = ROOT / "dags" / "airflow"
TARGETS = ("local", "kubernetes")
BLOCK = re.compile(r"(<!-- BEGIN GENERATED: explain train (\w+) -->\n)(.*?)(<!-- END GENERATED)", re.S)


def table(target: str) -> str:
    import torchstep

    trainer = f"{ROOT / 'components' / 'train.py'}:trainer"
    args = {"replicas": 2, "nproc_per_node": 2, "max_retries": 1, "image": "ghcr.io/torchstep/examples:latest"}
    return torchstep.explain(torchstep.materialize(trainer, args), target=target, width=110)


def regenerate(text: str) -> str:
    return BLOCK.sub(lambda m: f"{m.group(1)}```text\n{table(m.group(2))}```\n{m.group(4)}", text)


def test_translation_tables_match_explain():
    current = DOC.read_text()
    assert sorted(m.group(2) for m in BLOCK.finditer(current)) == sorted(TARGETS)
    assert regenerate(current) == current, "docs/airflow.md is stale: run `python tests/airflow/test_docs.py`"


def test_documented_example_dag_is_the_real_one():
    doc = DOC.read_text()
    dag = (DAGS / "torchstep_example.py").read_text()
    for line in dag.splitlines():
        if line.startswith(("    train = ", "    score = ", "def output_of", "@task.torchstep", "TRAINER = ")):
            assert line in doc, f"docs/airflow.md shows another example DAG than dags/airflow: {line!r}"


if __name__ == "__main__":
    DOC.write_text(regenerate(DOC.read_text()))
    sys.exit(0)
