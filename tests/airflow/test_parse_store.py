"""A re-parse of an unchanged DAG file in a fresh process (as the dag-processor's forked
child does every 30 s) reads the plan store (torchstep.components.plan_store) and imports
no TorchX; the validation stays what it was: a bad component argument is a DAG import error
naming the field on a hit and after an edit, and an edited component file is seen at once.
Parsed by a real ``DagBag``, each parse in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COMPONENT = '''
import torchx.specs as specs


def hello(steps: int = 10, nnodes: int = 1, image: str = ".") -> specs.AppDef:
    """Say hello.

    Args:
        steps: steps
        nnodes: nodes
        image: image
    """
    return specs.AppDef("hello", [specs.Role("worker", image=image, entrypoint="echo", args=[str(steps)],
                                             num_replicas=nnodes, max_retries=2)])
'''

DAG = """
from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator
COMP = {comp!r}
with DAG({dag_id!r}, schedule=None, params={{"n": 2}}):
{body}
"""
GOOD = (
    '    AppDefOperator(task_id="file", app=COMP, app_args={"steps": 3, "nnodes": 2})\n'
    '    AppDefOperator(task_id="templated", app=COMP, app_args=["--steps", "{{ params.n }}"])\n'
    '    AppDefOperator(task_id="builtin", app="utils.echo", app_args=["--msg", "hi"])\n'
)

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1], include_examples=False) if "include_examples" in DagBag.__init__.__code__.co_varnames \\
    else DagBag(sys.argv[1])
retries = {d: {t.task_id: t.retries for t in bag.dags[d].tasks} for d in bag.dags}
print("DAGBAG " + json.dumps({"dags": sorted(bag.dags), "retries": retries, "torchx": "torchx" in sys.modules,
                              "errors": {k.rsplit("/", 1)[-1]: v for k, v in bag.import_errors.items()}}))
"""


class Parser:
    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home, self.env = home, env

    def __call__(self, dags: Path) -> dict:
        proc = subprocess.run(
            [sys.executable, "-c", PARSE, str(dags)], env=self.env, capture_output=True, text=True, timeout=240
        )
        lines = [x for x in proc.stdout.splitlines() if x.startswith("DAGBAG ")]
        assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
        return json.loads(lines[-1][len("DAGBAG ") :])


@pytest.fixture
def parse(tmp_path: Path, env_of_home) -> Parser:
    return Parser(tmp_path, env_of_home(tmp_path, TORCHSTEP_PLAN_CACHE=str(tmp_path / "plan-store")))


def _dag(folder: Path, comp: Path, dag_id: str, body: str) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / f"{dag_id}.py"
    path.write_text(DAG.format(comp=f"{comp}:hello", dag_id=dag_id, body=body))
    return path


def _bump(path: Path, text: str) -> None:
    """Write ``text`` with a new mtime even on a coarse clock."""
    import os

    before = path.stat().st_mtime_ns
    path.write_text(text)
    if path.stat().st_mtime_ns == before:
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


def test_a_reparse_of_an_unchanged_file_imports_no_torchx(parse: Parser, tmp_path: Path) -> None:
    comp = tmp_path / "hello_component.py"
    comp.write_text(COMPONENT)
    _dag(tmp_path / "dags", comp, "good", GOOD)
    first = parse(tmp_path / "dags")
    assert first["dags"] == ["good"], first["errors"]
    assert first["torchx"]  # the first parse plans every task
    again = parse(tmp_path / "dags")
    assert again["dags"] == ["good"], again["errors"]
    assert not again["torchx"], "a re-parse of an unchanged file imported TorchX"
    assert again["retries"] == first["retries"] == {"good": {"file": 2, "templated": 2, "builtin": 0}}
    assert list((tmp_path / "plan-store").glob("*.json"))


def test_a_bad_argument_stays_an_import_error_on_a_hit_and_after_edits(parse: Parser, tmp_path: Path) -> None:
    comp = tmp_path / "hello_component.py"
    comp.write_text(COMPONENT)
    bad = '    AppDefOperator(task_id="t", app=COMP, app_args={"nnodez": 2})\n'
    dag = _dag(tmp_path / "dags", comp, "bad", bad)
    for _ in range(2):  # computed, then read back from the store
        parsed = parse(tmp_path / "dags")
        assert "bad" not in parsed["dags"]
        error = parsed["errors"].get("bad.py", "")
        assert "component.nnodez" in error and "has no parameter 'nnodez'; fix: use one of: " in error, error[-2000:]
    assert not parsed["torchx"]
    # the DAG file edited: another typo, named at once
    _bump(dag, DAG.format(comp=f"{comp}:hello", dag_id="bad", body=bad.replace("nnodez", "stpes")))
    error = parse(tmp_path / "dags")["errors"].get("bad.py", "")
    assert "has no parameter 'stpes'" in error, error[-2000:]
    # the component file edited to take the argument: the DAG parses at once
    _bump(comp, COMPONENT.replace("nnodes: int = 1,", "nnodes: int = 1, stpes: int = 0,"))
    parsed = parse(tmp_path / "dags")
    assert parsed["dags"] == ["bad"], parsed["errors"]
    # and back: the parameter removed again, the error is back
    _bump(comp, COMPONENT)
    parsed = parse(tmp_path / "dags")
    assert "has no parameter 'stpes'" in parsed["errors"].get("bad.py", ""), parsed


def test_an_edited_component_file_changes_the_retries_at_once(parse: Parser, tmp_path: Path) -> None:
    comp = tmp_path / "hello_component.py"
    comp.write_text(COMPONENT)
    _dag(tmp_path / "dags", comp, "edit", '    AppDefOperator(task_id="t", app=COMP, app_args={"steps": 3})\n')
    assert parse(tmp_path / "dags")["retries"] == {"edit": {"t": 2}}
    _bump(comp, COMPONENT.replace("max_retries=2", "max_retries=5"))
    assert parse(tmp_path / "dags")["retries"] == {"edit": {"t": 5}}
