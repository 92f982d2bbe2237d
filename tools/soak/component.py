"""The soak job as a TorchX component (``torchx run -s torchstep_local tools/soak/component.py:soak``).
Standalone on purpose: TorchX loads a component file by path, not as a package module."""

import os
import sys
from typing import Dict, Optional  # noqa: UP035  (TorchX's component linter reads these names)

from torchx import specs

#: job.py beside this file (TorchX execs a component file elsewhere: pass ``--job`` there).
JOB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "job.py")


def soak(
    replicas: int = 2,
    nproc: int = 2,
    max_restarts: int = 1,
    job: str = JOB,
    env: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
) -> specs.AppDef:
    """The soak job: ``replicas`` agents x ``nproc`` ranks printing numbered lines (see job.py),
    REPLICA retries with ``max_restarts`` restarts per agent. Its faults come from the
    ``SOAK_*`` environment of the process that runs it, or from ``env`` (a step that runs
    elsewhere, such as a served Prefect flow, does not inherit the submitter's environment).

    Args:
        replicas: agents (nodes).
        nproc: processes per agent.
        max_restarts: each agent's restart budget.
        job: the path of job.py.
        env: the role's environment (``SOAK_*``, ``TORCHSTEP_*``).

    Returns:
        The AppDef.
    """
    role = specs.Role(
        name="soak",
        image="unused",
        entrypoint=sys.executable,
        args=[job],
        env=dict(env or {}),
        num_replicas=replicas,
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
        max_retries=max_restarts,
        retry_policy=specs.RetryPolicy.REPLICA,
        metadata={"torchstep": {"nproc_per_node": nproc}},
    )
    return specs.AppDef("soak", roles=[role])
