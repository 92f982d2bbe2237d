"""Run the soak DAG (tools/soak/airflow_dag.py) once with ``dag.test()`` in this process and
print a JSON summary on the last line (the ``airflow`` surface runs one per soak run).

Usage: ``python airflow_driver.py DAG_FILE DAG_ID RUN_CONF_JSON``. The caller sets
``AIRFLOW_HOME`` (a migrated metadata DB) and ``AIRFLOW__CORE__DAGS_FOLDER`` (holding
DAG_FILE) before this imports Airflow, as tests/airflow/dag_test_driver.py does. The summary
(after ``SUMMARY``): the DAG run's state and run id and, per task, its state, try number,
``max_tries`` and XCom ``return_value``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from typing import Any

SUMMARY = "AIRFLOW_SOAK_SUMMARY "


def main(argv: list[str]) -> int:
    """Load the DAG file, run the DAG with ``dag.test()``, print the summary.

    Args:
        argv: DAG_FILE, DAG_ID, RUN_CONF_JSON.

    Returns:
        0 (the run's outcome is in the summary, not the exit status).
    """
    path, dag_id, conf = argv[0], argv[1], json.loads(argv[2])
    sys.path.append(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])  # as Airflow does for its dags bundle
    spec = importlib.util.spec_from_file_location("soak_dag", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from airflow.sdk import DAG

    dag = next(v for v in vars(module).values() if isinstance(v, DAG) and v.dag_id == dag_id)
    print(SUMMARY + json.dumps(summarize(dag_id, dag.test(run_conf=conf)), default=str), flush=True)
    return 0


def summarize(dag_id: str, dr: Any) -> dict[str, Any]:
    """The DAG run's state and its tasks' states, tries and XCom ``return_value`` (from the DB).

    Args:
        dag_id: the DAG.
        dr: the DagRun ``dag.test()`` returned.

    Returns:
        The summary.
    """
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    tasks = {}
    with create_session() as session:
        for ti in dr.get_task_instances(session=session):
            row = (
                session.query(XComModel)
                .filter_by(dag_id=dag_id, run_id=dr.run_id, task_id=ti.task_id, key="return_value")
                .one_or_none()
            )
            tasks[ti.task_id] = {
                "state": str(ti.state),
                "try_number": ti.try_number,
                "max_tries": ti.max_tries,
                "xcom": XComModel.deserialize_value(row) if row is not None else None,
            }
    return {"state": str(dr.state), "run_id": dr.run_id, "tasks": tasks}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
