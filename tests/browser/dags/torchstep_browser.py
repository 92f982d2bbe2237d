"""The DAG of tests/browser: three 2 x 2 steps side by side: one succeeds, one fails with a
non-retryable error on rank 3, one hangs until its execution_timeout stops it."""

import datetime
import os

from airflow.sdk import DAG
from torchstep_airflow import AppDefOperator

STEP = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "apps", "step.py") + ":ranks"
#: Every rank prints this many numbered lines first (a log the page must keep readable).
LINES = 300
#: Long enough for all four ranks to reach their hang on a loaded machine (30 s fired before
#: the workers started under a load average of 24).
HANG_TIMEOUT = datetime.timedelta(seconds=90)

with DAG("torchstep_browser", schedule=None, tags=["torchstep-test"]):
    AppDefOperator(task_id="succeeds", app=STEP, app_args={"mode": "ok", "lines": LINES})
    AppDefOperator(task_id="fails_on_rank_3", app=STEP, app_args={"mode": "fail", "lines": LINES})
    AppDefOperator(
        task_id="hangs",
        app=STEP,
        app_args={"mode": "hang", "lines": LINES, "max_retries": 0},
        execution_timeout=HANG_TIMEOUT,
    )
