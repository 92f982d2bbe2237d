"""torchstep for Prefect 3.

- :func:`app_task` / :func:`torchstep_task`: an AppDef or a TorchX component function as a
  Prefect task — the component's parameters as the task's, retries from the AppDef
  (never for a non-retryable failure), timeouts and cancellation that stop every process of
  the step, each rank's lines in the task run's log, a table and an outputs artifact.
- :func:`job_variables` / :func:`base_job_template`: Kubernetes work-pool job variables
  derived from an AppDef (cpu, memory, GPU, volumes) and the base job template that has them.

Importing this package imports neither torch nor prefect (they load when a function runs).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["StepFailed", "app_task", "base_job_template", "job_variables", "torchstep_task"]
_FROM = {"app_task": "tasks", "torchstep_task": "tasks", "StepFailed": "tasks",
         "job_variables": "deploy", "base_job_template": "deploy"}  # fmt: skip

if TYPE_CHECKING:  # pragma: no cover - for type checkers, IDEs and the API reference only
    from torchstep_prefect.deploy import base_job_template, job_variables
    from torchstep_prefect.tasks import StepFailed, app_task, torchstep_task


def __getattr__(name: str) -> Any:
    if name in _FROM:
        return getattr(importlib.import_module(f"torchstep_prefect.{_FROM[name]}"), name)
    if name == "__version__":  # written once, in pyproject.toml
        from importlib.metadata import version

        return version("torchstep-prefect")
    raise AttributeError(f"module 'torchstep_prefect' has no attribute {name!r}")
