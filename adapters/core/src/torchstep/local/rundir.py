"""The run directory of a local run: private, and claimed by one run at a time.

``<log_dir>`` is the user's (checked: a real directory they own; created ``0700`` when
missing). ``<log_dir>/<app_id>`` and every replica directory below it are created
``0700`` without following a symlink (:mod:`torchstep.files`). An exclusive ``flock`` on
``<app_id>/.lock``, held for the whole run, refuses a second run with the same run id
instead of interleaving two runs' logs and results in one directory.

Example::

    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> fd = claim_run_dir(root, os.path.join(root, "app-1"), [os.path.join(root, "app-1", "r", "0")], "app-1")
    >>> claim_run_dir(root, os.path.join(root, "app-1"), [], "app-1")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg['run_id'] (target 'local'): another run with the app id app-1 is running (...); fix: wait for it to end, or give this run another run_id
    >>> os.close(fd)
"""

from __future__ import annotations

import fcntl
import os

from torchstep.errors import SpecError
from torchstep.files import UnsafePathError, open_private, private_dir, private_root

TARGET = "local"


def claim_run_dir(log_dir: str, run_dir: str, replica_dirs: list[str], app_id: str) -> int:
    """Create and lock the run directory (see the module docstring) before anything starts.

    Args:
        log_dir: the log root the user named.
        run_dir: the run's directory under it.
        replica_dirs: every replica's directory (created too).
        app_id: the run's id.

    Returns:
        The fd that holds the lock (close it when the run ended).

    Raises:
        SpecError: naming ``log_dir`` (an unusable directory) or ``cfg['run_id']`` (claimed
            by a running run).
    """
    try:
        private_root(log_dir)
        private_dir(run_dir)
        lock = open_private(os.path.join(run_dir, ".lock"), os.O_RDWR | os.O_CREAT)
    except UnsafePathError as e:
        raise SpecError("log_dir", TARGET, f"{e.path}: {e.problem}", fix=e.fix) from None
    except OSError as e:
        raise SpecError("log_dir", TARGET, f"{run_dir}: {e.strerror}", fix="choose a directory you can write") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock)
        raise SpecError(
            "cfg['run_id']",
            TARGET,
            f"another run with the app id {app_id} is running ({run_dir})",
            fix="wait for it to end, or give this run another run_id",
        ) from None
    try:
        for d in replica_dirs:
            private_dir(d)
    except UnsafePathError as e:
        os.close(lock)
        raise SpecError("log_dir", TARGET, f"{e.path}: {e.problem}", fix=e.fix) from None
    return lock
