"""The embedded elastic agent: ``torchstep-agent``, a torchrun-compatible step entrypoint
built on ``torch.distributed.elastic`` (see ``docs/agent.md``).

Importing this package does not import torch; :func:`main` does.

Example::

    >>> from torchstep.agent import shims_dir
    >>> import os
    >>> os.access(os.path.join(shims_dir(), "torchrun"), os.X_OK)
    True

Command line::

    torchstep-agent --nproc-per-node 2 --result-file result.json train.py
    python -m torchstep.agent --nproc-per-node 2 train.py
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.lazy import lazy_names

__all__ = ["main", "shims_dir"]

if TYPE_CHECKING:  # pragma: no cover
    from torchstep.agent.cli import main


def shims_dir() -> str:
    """The directory with the ``torchrun`` shim: put it first on ``PATH`` and every
    ``torchrun ...`` command line (e.g. TorchX ``dist.ddp``) runs under this agent.

    Example::

        env["PATH"] = f"{shims_dir()}:{env['PATH']}"
        env["TORCHSTEP_PYTHON"] = sys.executable
    """
    from torchstep.contract import shim_dir

    return shim_dir()


__getattr__ = lazy_names(__name__, "torchstep", {"main": "torchstep.agent.cli"})
