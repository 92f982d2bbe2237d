"""A TorchX component of the KFP progress test: a step that reports its progress.

Loaded by TorchX (real annotations: no ``from __future__ import annotations``)."""

import sys

from torchx import specs

#: The worker: ``torchstep.progress(i, steps)`` every 0.3 s, then a metric of its own.
CODE = """
import sys, time
import torchstep
steps = int(sys.argv[1])
for i in range(steps):
    time.sleep(0.3)
    torchstep.progress(i + 1, steps)
torchstep.output("metrics", {"loss": 0.25})
"""


def counting(steps: int = 4) -> specs.AppDef:
    """Count to ``steps``, reporting each as progress.

    Args:
        steps: how many steps to report
    """
    role = specs.Role(
        "counter",
        image="python:3.11",
        entrypoint=sys.executable,
        args=["-c", CODE, str(steps)],
        resource=specs.Resource(cpu=1, gpu=0, memMB=256),
    )
    return specs.AppDef("counting", roles=[role])
