"""A flow of a torchstep task served on a cron schedule (run by test_serve.py in its own
process, against a real Prefect server): ``python served_flow.py``."""

import sys
from pathlib import Path

from prefect import flow
from torchstep_prefect import app_task

STEPS = Path(__file__).resolve().parents[1] / "apps" / "steps.py"
sleeper = app_task(f"{STEPS}:sleeper", defaults={"mark": ""})


@flow(log_prints=True)
def nightly(mark: str, seconds: float = 0.5) -> str:
    return sleeper(mark=mark, seconds=seconds, replicas=2)["state"]


if __name__ == "__main__":
    nightly.serve(name="nightly", cron=sys.argv[1] if len(sys.argv) > 1 else "0 2 * * *")
