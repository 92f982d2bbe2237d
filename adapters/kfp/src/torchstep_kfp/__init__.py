"""torchstep for Kubeflow Pipelines v2.

- :func:`apply_plan`: set every setting of an AppDef's plan on a ``PipelineTask`` the user
  built (resources, accelerator, ``set_retry``, env, Secrets, PVCs, node selectors, timeout,
  display name, caching off).

The component builders (``component_from_app``, ``component_from_fn``) are still to come.
Importing this package imports neither torch nor kfp (kfp loads when a function runs).
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply_plan", "plan_of"]


def __getattr__(name: str) -> Any:
    if name in ("apply_plan", "plan_of"):
        from torchstep_kfp import tasks

        return getattr(tasks, name)
    if name == "__version__":  # written once, in pyproject.toml
        from importlib.metadata import version

        return version("torchstep-kfp")
    raise AttributeError(f"module 'torchstep_kfp' has no attribute {name!r}")
