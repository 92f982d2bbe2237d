"""The Prefect flow of tests/browser: the three 2 x 2 steps of ``step.py:ranks`` side by side
(one succeeds, one fails with a non-retryable error on rank 3, one hangs until its
``timeout_seconds`` stops it), run against the server of ``PREFECT_API_URL``.

Usage: ``prefect_flow.py HANG_TIMEOUT_S``; prints one line ``FLOW_RUN <json>`` with the flow
run's id and each task run's id, name and state.
"""

# No `from __future__ import annotations`: Prefect reads the flow's annotations.
import json
import os
import sys

from prefect import flow
from torchstep_prefect import app_task

STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step.py") + ":ranks"
LINES = 300


def main(hang_timeout_s: float) -> None:
    succeeds = app_task(STEP, name="succeeds", defaults={"mode": "ok"})
    fails = app_task(STEP, name="fails-on-rank-3", defaults={"mode": "fail"})
    hangs = app_task(STEP, name="hangs", defaults={"mode": "hang", "max_retries": 0}, timeout_seconds=hang_timeout_s)

    @flow(name="torchstep-browser")
    def pipeline() -> dict:
        futures = {
            "succeeds": succeeds.submit(mode="ok", lines=LINES),
            "fails-on-rank-3": fails.submit(mode="fail", lines=LINES),
            "hangs": hangs.submit(mode="hang", lines=LINES, max_retries=0),
        }
        for f in futures.values():
            f.wait(600)
        return {name: {"id": str(f.task_run_id), "state": f.state.name} for name, f in futures.items()}

    state = pipeline(return_state=True)
    tasks = state.result(raise_on_failure=False) if state.is_completed() else None  # the flow's own failure: None
    print(
        "FLOW_RUN " + json.dumps({"id": str(state.state_details.flow_run_id), "state": state.name, "tasks": tasks}),
        flush=True,
    )


if __name__ == "__main__":
    main(float(sys.argv[1]))
