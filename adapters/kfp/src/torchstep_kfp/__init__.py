"""torchstep for Kubeflow Pipelines v2.

The component builders (``component_from_app``, ``component_from_fn``) land with the KFP
issue; this package already installs and imports without pulling in torch.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "__version__":  # written once, in pyproject.toml
        from importlib.metadata import version

        return version("torchstep-kfp")
    raise AttributeError(f"module 'torchstep_kfp' has no attribute {name!r}")
