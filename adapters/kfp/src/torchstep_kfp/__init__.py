"""torchstep for Kubeflow Pipelines v2.

- :func:`component_from_fn` / :func:`component_from_app`: KFP container components whose
  inputs are a component function's parameters (or a fixed AppDef), run by
  ``python3 -m torchstep_kfp.entry`` in the image; calling one in a ``@dsl.pipeline`` gives
  a ``PipelineTask`` with the plan applied; multi-pod AppDefs run through a launcher step.
- :func:`apply_plan`: set every setting of an AppDef's plan on a ``PipelineTask`` the user
  built (resources, accelerator, ``set_retry``, env, Secrets, PVCs, node selectors, timeout,
  display name, caching off).

Importing this package imports neither torch nor kfp (kfp loads when a function runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.adapter import lazy_names

__all__ = ["StepComponent", "apply_plan", "component_from_app", "component_from_fn", "plan_of"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers, IDEs and the API reference only
    from torchstep_kfp.components import StepComponent, component_from_app, component_from_fn
    from torchstep_kfp.tasks import apply_plan, plan_of

__getattr__ = lazy_names(
    __name__,
    "torchstep-kfp",
    {
        "apply_plan": "torchstep_kfp.tasks",
        "plan_of": "torchstep_kfp.tasks",
        "StepComponent": "torchstep_kfp.components",
        "component_from_app": "torchstep_kfp.components",
        "component_from_fn": "torchstep_kfp.components",
    },
)
