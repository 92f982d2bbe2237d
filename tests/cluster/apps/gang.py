"""TorchX component of the adapters' tests on real pods (tests/cluster/test_adapters_on_pods.py):
a gang of ``replicas`` pods x ``nproc_per_node`` ranks that all-reduce once per step. Loaded by
TorchX (real annotations: no ``from __future__ import annotations``)."""

import os

from torchx import specs

# TorchX execs a component file without __file__: the script is found from the repository root.
HERE = os.path.abspath(os.path.join("tests", "cluster", "apps"))


def allreduce_steps(
    steps: int = 3,
    interval: float = 0.0,
    replicas: int = 2,
    nproc_per_node: int = 2,
    max_retries: int = 0,
    retry_delay: float = 0.0,
) -> specs.AppDef:
    """Every rank all-reduces ``steps`` times and prints each step; rank 0 publishes the sum.

    Args:
        steps: how many all-reduces every rank does
        interval: seconds every rank sleeps after each step
        replicas: pods of the gang
        nproc_per_node: ranks per pod
        max_retries: the orchestrator's retries of the step (APPLICATION policy)
        retry_delay: seconds before such a retry (0: the orchestrator's default)
    """
    role = specs.Role(
        "trainer",
        image="python:3.11",  # never pulled on the one-machine cluster: pods run the checkout's .venv
        entrypoint="python",
        args=[os.path.join(HERE, "rank_steps.py"), "--steps", str(steps), "--interval", str(interval)],
        num_replicas=replicas,
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
        metadata={
            "torchstep": {"nproc_per_node": nproc_per_node, **({"retry_delay": retry_delay} if retry_delay else {})}
        },
    )
    return specs.AppDef("gang", roles=[role])
