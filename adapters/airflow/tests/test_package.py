"""The distribution as Airflow sees it: a provider with an operator and @task.torchstep,
and a package whose import costs a DAG file nothing heavy."""

import os
import subprocess
import sys
from importlib.metadata import entry_points, version

HEAVY = ("torch", "kfp", "prefect", "kubernetes")


def _loaded_after(code: str) -> list[str]:
    probe = f"import sys\n{code}\nprint(','.join(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, env=os.environ)
    last = (out.stdout.strip().splitlines() or [""])[-1]
    return [m for m in last.split(",") if m]


def test_importing_the_package_loads_nothing_heavy_not_even_airflow():
    assert _loaded_after("import torchstep_airflow; assert 'airflow' not in sys.modules") == []


def test_parsing_a_dag_with_operators_for_both_targets_loads_no_torch_or_kubernetes_client():
    dag = (
        "from airflow.sdk import DAG\n"
        "from torchstep_airflow import AppDefOperator\n"
        "with DAG('d', schedule=None):\n"
        "    AppDefOperator(task_id='a', app='utils.echo', app_args=['--msg', 'hi'])\n"
        "    AppDefOperator(task_id='b', app='utils.echo', app_args={'msg': '{{ ds }}'}, target='kubernetes')\n"
    )
    assert _loaded_after(dag) == []


def test_provider_entry_point_is_import_free_and_names_the_distribution():
    (ep,) = [e for e in entry_points(group="apache_airflow_provider") if e.value.startswith("torchstep_airflow")]
    code = (
        f"import sys; from {ep.module} import {ep.attr} as f; info = f();"
        "assert 'airflow' not in sys.modules and 'torchstep' not in sys.modules, sorted(sys.modules);"
        "print(info['package-name'], info['task-decorators'][0]['name'])"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["torchstep-airflow", "torchstep"]


def test_airflow_providers_list_shows_torchstep_airflow():
    airflow = os.path.join(os.path.dirname(sys.executable), "airflow")
    out = subprocess.run(
        [airflow, "providers", "list", "--output", "plain"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()]
    # the version Airflow shows is the distribution's (get_provider_info has no copy of it)
    assert any(row and row[0] == "torchstep-airflow" and row[-1] == version("torchstep-airflow") for row in rows), (
        out.stdout
    )
