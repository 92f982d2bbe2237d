"""torchstep for Prefect 3.

``app_task`` lands with the Prefect issue; this package already installs and imports
without pulling in torch.
"""

from __future__ import annotations

from typing import Any

__all__: list[str] = []


def __getattr__(name: str) -> Any:
    if name == "__version__":  # written once, in pyproject.toml
        from importlib.metadata import version

        return version("torchstep-prefect")
    raise AttributeError(f"module 'torchstep_prefect' has no attribute {name!r}")
