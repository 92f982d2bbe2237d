"""``python -m torchstep.launch CMD [ARGS...]``: exec CMD with the ``torchrun`` shim first on
PATH, so a role that runs its own ``torchrun`` (TorchX ``dist.ddp``) runs under
``torchstep-agent`` inside a container. Standard library only: it is the container's
entry point.

Example::

    python -m torchstep.launch bash -c "torchrun --nproc-per-node 2 train.py"
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from torchstep.contract import USAGE_EXIT_CODE, shim_dir


def path_with_shim(path: str | None) -> str:
    """``PATH`` with the shim directory first.

    Example::

        >>> path_with_shim("/usr/bin").endswith(":/usr/bin")
        True
    """
    return os.pathsep.join([shim_dir(), *([path] if path else [])])


def main(argv: Sequence[str] | None = None) -> None:
    """Exec ``argv`` (default ``sys.argv[1:]``) with the shim first on PATH."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print("usage: python -m torchstep.launch CMD [ARGS...]", file=sys.stderr)
        raise SystemExit(USAGE_EXIT_CODE)
    os.environ["PATH"] = path_with_shim(os.environ.get("PATH"))
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
