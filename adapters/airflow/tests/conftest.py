"""The adapter's own tests run in an environment with only torchstep, torchstep-airflow,
apache-airflow and pytest (tools/test_isolated.py). Airflow reads its configuration once
per process, so a private AIRFLOW_HOME is set before anything imports it."""

import atexit
import os
import shutil
import tempfile

if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="torchstep-airflow-unit-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
