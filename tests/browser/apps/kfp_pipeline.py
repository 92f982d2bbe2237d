"""The kfp.local pipeline of tests/browser: one step of ``step.py:ranks`` (1 replica x 4 ranks:
kfp.local runs one container; a step of several replicas is a launcher of Kubernetes Jobs).

Usage: ``kfp_pipeline.py MODE PIPELINE_ROOT`` (MODE ok, fail or hang; hang is stopped by the
step's ``timeout`` run option); prints what kfp.local prints, then one line
``KFP_RESULT <state>`` or ``KFP_RAISED <exception>``.
"""

# No `from __future__ import annotations`: KFP reads the pipeline function's annotations.
import os
import sys

from kfp import dsl, local
from torchstep_kfp import component_from_fn

STEP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step.py") + ":ranks"
LINES = 300
HANG_TIMEOUT_S = 60  # the ranks start within it on a loaded machine


def main(mode: str, root: str) -> None:
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=root)
    cfg = {"timeout": HANG_TIMEOUT_S} if mode == "hang" else None
    step = component_from_fn(
        STEP, defaults={"mode": mode, "lines": LINES, "replicas": 1, "max_retries": 0 if mode == "hang" else 1}, cfg=cfg
    )

    @dsl.pipeline
    def pipeline() -> dict:
        return step().outputs["result"]

    try:
        print("KFP_RESULT " + pipeline().output["state"], flush=True)
    except Exception as e:  # kfp.local raises when a task fails: what a user sees last
        print(f"KFP_RAISED {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
