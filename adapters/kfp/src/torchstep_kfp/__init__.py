"""torchstep for Kubeflow Pipelines v2.

The component builders (``component_from_app``, ``component_from_fn``) land with the KFP
issue; this package already installs and imports without pulling in torch.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__: list[str] = []
