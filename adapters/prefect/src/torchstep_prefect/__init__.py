"""torchstep for Prefect 3.

``app_task`` lands with the Prefect issue; this package already installs and imports
without pulling in torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__: list[str] = []
