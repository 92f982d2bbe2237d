"""Run one DAG with ``dag.test()`` in this process and print a JSON summary on the last line.

Usage: ``python dag_test_driver.py DAG_FILE DAG_ID [RUN_CONF_JSON]``. The caller sets
AIRFLOW_HOME (a migrated metadata DB) and AIRFLOW__CORE__DAGS_FOLDER (holding DAG_FILE)
in the environment before this imports Airflow. The summary: the run's state and, per
task, its state, try number and XCom ``return_value``. A JSON *list* of confs runs the DAG
once per conf in this one process (Airflow imported once), each run's lines after a
``DAG_TEST_BEGIN <i>`` line and followed by its summary.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

MARK = "DAG_TEST_SUMMARY "
BEGIN = "DAG_TEST_BEGIN "


def main() -> None:
    path, dag_id = sys.argv[1], sys.argv[2]
    conf = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
    sys.path.append(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])  # as Airflow does for its dags bundle
    spec = importlib.util.spec_from_file_location("dag_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from airflow.sdk import DAG

    dag = next(v for v in vars(module).values() if isinstance(v, DAG) and v.dag_id == dag_id)
    for i, one in enumerate(conf if isinstance(conf, list) else [conf]):
        print(f"{BEGIN}{i}", flush=True)
        summarize(dag, dag_id, dag.test(run_conf=one))


def summarize(dag, dag_id: str, dr) -> None:
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
    print(MARK + json.dumps({"state": str(dr.state), "run_id": dr.run_id, "tasks": tasks}, default=str), flush=True)


if __name__ == "__main__":
    main()
