"""TorchX's own schedulers, registered again next to ours.

TorchX 0.7.0 reads the ``torchx.schedulers`` entry points *instead of* its built-in list as
soon as one exists, so installing torchstep (which registers ``torchstep_local``) would hide
``local_cwd``, ``kubernetes``, ``slurm``... This module gives each built-in name a factory
that loads TorchX's own module for it; ``adapters/core/pyproject.toml`` registers them
first, in TorchX's order, so the default scheduler (the first one) stays TorchX's default.

TorchX nightly merges plugins with its built-ins and removed some of them; a name it no
longer ships fails with a clear error instead of an ImportError.

    >>> from torchx.schedulers import get_scheduler_factories
    >>> {"local_cwd", "kubernetes", "slurm", "torchstep_local"} <= set(get_scheduler_factories())
    True
"""

from __future__ import annotations

import importlib
from typing import Any

#: TorchX 0.7.0's built-in schedulers, in its order (the first is its default).
BUILTINS = (
    "local_docker",
    "local_cwd",
    "slurm",
    "kubernetes",
    "kubernetes_mcad",
    "aws_batch",
    "aws_sagemaker",
    "gcp_batch",
    "ray",
    "lsf",
)


def create(name: str, session_name: str, **kwargs: Any) -> Any:
    """TorchX's own scheduler ``name``, created as TorchX would create it."""
    from torchx.schedulers import DEFAULT_SCHEDULER_MODULES

    module = DEFAULT_SCHEDULER_MODULES.get(name)
    if module is None:
        raise ValueError(
            f"scheduler {name!r} is not part of the installed torchx (TorchX nightly removed it); "
            f"fix: use one of {', '.join(DEFAULT_SCHEDULER_MODULES)} or install torchx==0.7.0"
        )
    try:
        return importlib.import_module(module).create_scheduler(session_name, **kwargs)
    except (ImportError, NameError) as e:  # 0.7.0's ray scheduler raises NameError without ray
        raise ValueError(
            f"scheduler {name!r} needs packages that are not installed ({e}); "
            f"fix: install what TorchX's {name} scheduler needs (e.g. pip install 'torchx[{name}]')"
        ) from None


def _factory(name: str) -> Any:
    def factory(session_name: str, **kwargs: Any) -> Any:
        return create(name, session_name, **kwargs)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"TorchX's built-in ``{name}`` scheduler."
    return factory


local_docker = _factory("local_docker")
local_cwd = _factory("local_cwd")
slurm = _factory("slurm")
kubernetes = _factory("kubernetes")
kubernetes_mcad = _factory("kubernetes_mcad")
aws_batch = _factory("aws_batch")
aws_sagemaker = _factory("aws_sagemaker")
gcp_batch = _factory("gcp_batch")
ray = _factory("ray")
lsf = _factory("lsf")
