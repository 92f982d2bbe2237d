"""A typo in a component's arguments is a DAG import error when Airflow parses the file (as
docs/airflow.md promises), for every way of naming the component — a TorchX builtin,
``file.py:fn``, a callable, ``@task.torchstep``, a ready AppDef — with static or templated
values, and the error lists the parameters. Parsed by a real ``DagBag`` in its own process."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

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
                                             num_replicas=nnodes)])
'''

HEAD = """
import sys
from airflow.sdk import DAG, task
from torchstep_airflow import AppDefOperator
sys.path.insert(0, {components!r})
from hello_component import hello
COMP = {components!r} + "/hello_component.py:hello"
with DAG({dag_id!r}, schedule=None, params={{"n": 2}}):
"""

#: DAG file name -> (task body, the parameter name the error must name)
CASES = {
    "builtin_static": ('AppDefOperator(task_id="t", app="utils.echo", app_args={"mgs": "hi"})', "mgs"),
    "builtin_templated": ('AppDefOperator(task_id="t", app="utils.echo", app_args={"mgs": "{{ params.n }}"})', "mgs"),
    "builtin_argv": ('AppDefOperator(task_id="t", app="utils.echo", app_args=["--num_replica", "2"])', "num_replica"),
    "file_argv_templated": ('AppDefOperator(task_id="t", app=COMP, app_args=["--stpes", "{{ params.n }}"])', "stpes"),
    "file_abbreviated": ('AppDefOperator(task_id="t", app=COMP, app_args=["--nnode", "2"])', "nnode"),
    "file_mapping": ('AppDefOperator(task_id="t", app=COMP, app_args={"nnodez": 2})', "nnodez"),
    "callable_templated": (
        'AppDefOperator(task_id="t", app=hello, app_args={"stpes": "{{ params.n }}", "nnodes": 2})',
        "stpes",
    ),
    "callable_argv": ('AppDefOperator(task_id="t", app=hello, app_args=["--step", "{{ params.n }}"])', "step"),
    "decorated": ('task.torchstep(task_id="t")(hello)(stpes="{{ params.n }}")', "stpes"),
}
GOOD = (
    'AppDefOperator(task_id="a", app=COMP, app_args=["--steps", "{{ params.n }}", "--nnodes", "2"])\n'
    '    AppDefOperator(task_id="b", app=hello, app_args={"steps": "{{ params.n }}"})\n'
    '    AppDefOperator(task_id="c", app="utils.echo", app_args={"msg": "{{ params.n }}"})\n'
    '    task.torchstep(task_id="d")(hello)(steps="{{ params.n }}")'
)
APPDEF = """
    from torchx import specs
    app = specs.AppDef("x", [specs.Role("r", image=".", entrypoint="echo")])
    AppDefOperator(task_id="t", app=app, app_args={"steps": 2})
"""

PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1], include_examples=False) if "include_examples" in DagBag.__init__.__code__.co_varnames \\
    else DagBag(sys.argv[1])
print("DAGBAG " + json.dumps({"dags": sorted(bag.dags), "errors": {k.rsplit("/", 1)[-1]: v for k, v in
                              bag.import_errors.items()}}))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory, env_of_home) -> dict:
    home = tmp_path_factory.mktemp("airflow-parse")
    dags, components = home / "dags", home / "components"
    dags.mkdir()
    components.mkdir()
    (components / "hello_component.py").write_text(COMPONENT)
    for name, (body, _) in {**CASES, "good": (GOOD, None), "appdef": ("", None)}.items():
        head = HEAD.format(components=str(components), dag_id=name)
        text = head + ("    " + body + "\n" if name != "appdef" else APPDEF)
        (dags / f"{name}.py").write_text(textwrap.dedent(text))
    proc = subprocess.run(
        [sys.executable, "-c", PARSE, str(dags)], env=env_of_home(home), capture_output=True, text=True, timeout=240
    )
    lines = [x for x in proc.stdout.splitlines() if x.startswith("DAGBAG ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("DAGBAG ") :])


def test_a_dag_with_every_argument_right_parses(parsed: dict) -> None:
    assert "good" in parsed["dags"], parsed["errors"].get("good.py")


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_typo_in_app_args_is_a_dag_import_error_naming_the_parameters(parsed: dict, case: str) -> None:
    assert case not in parsed["dags"], f"{case}: the DAG parsed although app_args has a typo"
    error = parsed["errors"].get(f"{case}.py", "")
    name = CASES[case][1]
    assert f"has no parameter '{name}'; fix: use one of: " in error, error[-2000:]
    listed = "msg, image, num_replicas" if case.startswith("builtin") else "steps, nnodes, image"
    assert listed in error, error[-2000:]


def test_arguments_with_a_ready_appdef_are_a_dag_import_error(parsed: dict) -> None:
    assert "appdef" not in parsed["dags"]
    assert "arguments were given with a ready AppDef" in parsed["errors"].get("appdef.py", "")
