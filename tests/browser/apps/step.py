"""The TorchX component of the browser tests: a 2 x 2 step (2 replicas of 2 ranks, the local
target) running ``ranks.py`` (loaded by TorchX: real annotations, no ``from __future__``)."""

import os
import sys

from torchx import specs

# TorchX execs a component file without __file__: then the script is found from the repository root.
HERE = (
    os.path.dirname(os.path.abspath(__file__)) if "__file__" in globals() else os.path.join("tests", "browser", "apps")
)
RANKS = os.path.abspath(os.path.join(HERE, "ranks.py"))


def ranks(mode: str = "ok", lines: int = 300, max_retries: int = 1, replicas: int = 2) -> specs.AppDef:
    """Run ranks.py on 4 ranks: 2 replicas x 2 ranks (1 x 4 under kfp.local, where a step of
    several replicas is a launcher of Kubernetes Jobs).

    Args:
        mode: ok, fail (rank 3 raises NonRetryableError) or hang (rank 3 never returns)
        lines: numbered lines each rank prints first
        max_retries: the step's APPLICATION retries (the orchestrator's)
        replicas: 2 (2 ranks each) or 1 (4 ranks)
    """
    role = specs.Role(
        "trainer",
        image="python:3.11",
        entrypoint=sys.executable,
        args=[RANKS, mode, str(lines)],
        num_replicas=replicas,
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"nproc_per_node": 4 // replicas, "retry_delay": 1}},
    )
    return specs.AppDef(f"ranks-{mode}", roles=[role])
