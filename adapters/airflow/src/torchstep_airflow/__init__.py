"""torchstep for Apache Airflow 3: run a TorchX AppDef as an Airflow task.

``AppDefOperator`` runs an AppDef (or a TorchX component and its arguments) under
torchstep's embedded elastic agent, locally in the Airflow worker or on Kubernetes;
``@task.torchstep`` (registered through the provider entry point) turns a component
function into a task.

Importing this package is free: it imports neither Airflow nor torch, TorchX, kfp,
prefect or the Kubernetes client — names load on first use, so DAG files stay cheap to
parse (the scheduler re-parses them every 30 s).

Example::

    from airflow.sdk import DAG
    from torchstep_airflow import AppDefOperator

    with DAG("train", params={"lr": 0.1}):
        AppDefOperator(task_id="train", app="dist.ddp",
                       app_args=["-j", "2x2", "--script", "train.py", "--", "--lr", "{{ params.lr }}"])
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> module that defines it (loaded lazily). Not torchstep.lazy: the provider
# entry point (get_provider_info) imports this package and must import nothing else.
_LAZY = {
    "AppDefOperator": "torchstep_airflow.operators",
    "torchstep_task": "torchstep_airflow.decorators",
    "task_run_id": "torchstep_airflow.settings",
}

__all__ = ["AppDefOperator", "task_run_id", "torchstep_task"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchstep_airflow.decorators import torchstep_task
    from torchstep_airflow.operators import AppDefOperator
    from torchstep_airflow.settings import task_run_id


def __getattr__(name: str) -> Any:
    if name == "__version__":  # written once, in pyproject.toml
        from importlib.metadata import version

        return version("torchstep-airflow")
    if name == "step_run_id":  # its name until 0.2: core's step_run_id takes the parts in order
        import warnings

        warnings.warn("torchstep_airflow.step_run_id is now task_run_id", DeprecationWarning, stacklevel=2)
        name = "task_run_id"
    if name not in _LAZY:
        raise AttributeError(f"module 'torchstep_airflow' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
