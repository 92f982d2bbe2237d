"""torchstep: TorchX AppDefs as native steps of Airflow, KFP v2 and Prefect, each run
under an embedded elastic agent.

Importing this package is cheap: it never imports torch, and submodules load on first
use (the Airflow scheduler re-parses DAG files that import us every 30 s).

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("utils.echo", ["--msg", "hi"])
    >>> torchstep.build_plan(app, target="local").roles[0].name
    'echo'
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.errors import AGENT_ERROR_EXIT_CODE, NON_RETRYABLE_EXIT_CODE, NonRetryableError, RunError, SpecError
from torchstep.lazy import lazy_names

# public name -> module that defines it (loaded lazily)
_LAZY = {
    "materialize": "torchstep.components.builders",
    "build_plan": "torchstep.plan.planner",
    "StepPlan": "torchstep.plan.model",
    "RolePlan": "torchstep.plan.model",
    "explain": "torchstep.plan.explain",
    "run_local": "torchstep.steps",
    "ReplicaEvent": "torchstep.local",
    "StepResult": "torchstep.result",
    "StepState": "torchstep.result",
    "record": "torchstep.worker",
    "expires": "torchstep.worker",
    "heartbeat": "torchstep.worker",
    "output": "torchstep.worker",
    "progress": "torchstep.worker",
    "checkpoint_dir": "torchstep.worker",
    "last_checkpoint": "torchstep.worker",
}
# submodules that ``torchstep.<name>`` imports on first use
_SUBMODULES = [
    "agent",
    "components",
    "contract",
    "files",
    "kubernetes",
    "launch",
    "local",
    "plan",
    "result",
    "steps",
    "worker",
]

__all__ = [
    "AGENT_ERROR_EXIT_CODE",
    "NON_RETRYABLE_EXIT_CODE",
    "NonRetryableError",
    "ReplicaEvent",
    "RolePlan",
    "RunError",
    "SpecError",
    "StepPlan",
    "StepResult",
    "StepState",
    "build_plan",
    "checkpoint_dir",
    "expires",
    "explain",
    "heartbeat",
    "kubernetes",
    "last_checkpoint",
    "materialize",
    "output",
    "progress",
    "record",
    "run_local",
]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchstep import kubernetes
    from torchstep.components.builders import materialize
    from torchstep.local import ReplicaEvent
    from torchstep.plan.explain import explain
    from torchstep.plan.model import RolePlan, StepPlan
    from torchstep.plan.planner import build_plan
    from torchstep.result import StepResult, StepState
    from torchstep.steps import run_local
    from torchstep.worker import checkpoint_dir, expires, heartbeat, last_checkpoint, output, progress, record


__getattr__ = lazy_names(__name__, "torchstep", _LAZY, submodules=_SUBMODULES)
