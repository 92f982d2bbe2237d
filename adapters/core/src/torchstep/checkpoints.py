"""The step's checkpoint directory: the one place a local step keeps state across tries.

A crash of the orchestrator's worker kills every process of a local step (nothing survives
its watcher), and the retry starts afresh; a step that should *resume* saves checkpoints in
the directory named by the local run option ``checkpoint_dir``. Each rank finds it in
``TORCHSTEP_CHECKPOINT_DIR`` and the newest checkpoint in ``TORCHSTEP_LAST_CHECKPOINT``
(``torchstep.last_checkpoint()`` looks again at call time: a worker restarted by the agent
sees what its predecessor saved).

The newest checkpoint is the most recently modified entry (file or directory) directly in
the directory, ties broken by name; names starting with ``.`` or ending in ``.tmp``,
``.partial`` or ``.incomplete`` are being written and never count, and symlinks are never
followed. Write a checkpoint under a temporary name and rename it when complete.

A checkpoint is loaded as code (a pickle), so nothing another user could have written
counts, checked on every look (OpenSSH's ``StrictModes``, :mod:`torchstep.files`): every
directory above the checkpoint directory is root's or the caller's and not writable by
others unless sticky; the directory itself is the caller's and nobody else can write it
(else :class:`~torchstep.files.UnsafePathError`); an entry owned by someone else, or one
others can write, is skipped with a warning that says why.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> latest_checkpoint(d) is None
    True
    >>> open(os.path.join(d, "epoch-1.pt"), "w").close(); open(os.path.join(d, "epoch-2.pt.tmp"), "w").close()
    >>> os.path.basename(latest_checkpoint(d))
    'epoch-1.pt'
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Callable

from torchstep.files import UnsafePathError, check_ancestors, check_private_dir, private_dir

__all__ = ["INCOMPLETE_SUFFIXES", "CheckpointWarning", "UnsafePathError", "latest_checkpoint", "prepare_checkpoint_dir"]

#: Names of entries still being written (never a checkpoint).
INCOMPLETE_SUFFIXES = (".tmp", ".partial", ".incomplete")


class CheckpointWarning(UserWarning):
    """An entry of the checkpoint directory that was skipped because someone other than
    the caller owns it or could have written it."""


def prepare_checkpoint_dir(directory: str | os.PathLike[str]) -> list[str]:
    """Create the checkpoint directory (``0700``, missing parents too) or check the existing
    one (an existing directory others can read keeps its mode: it is said, never changed).

    Args:
        directory: the checkpoint directory.

    Returns:
        The warnings to show (empty when all is well).

    Raises:
        torchstep.files.UnsafePathError: a symlink, a directory owned by someone else or
            writable by others, or one under a directory that fails
            :func:`~torchstep.files.check_ancestors`.

    Example::

        >>> import tempfile
        >>> prepare_checkpoint_dir(os.path.join(tempfile.mkdtemp(), "ckpt"))
        []
    """
    path = os.path.abspath(os.fspath(directory))
    check_ancestors(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        private_dir(path)
        return []
    check_private_dir(path)
    if st.st_mode & 0o077:
        return [
            f"checkpoint_dir {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}); its mode is left as "
            f"it is: chmod 700 {path} to keep the checkpoints private"
        ]
    return []


def latest_checkpoint(directory: str | os.PathLike[str], *, warn: Callable[[str], None] | None = None) -> str | None:
    """The path of the newest complete checkpoint in ``directory`` (see the module
    docstring), or ``None`` when it holds none or does not exist. Every call checks the
    directory again; an entry skipped because of its owner or mode is reported through
    ``warn`` (default: a :class:`CheckpointWarning`).

    Args:
        directory: the checkpoint directory.
        warn: called with one line per skipped entry; ``None``: warn with
            :class:`CheckpointWarning`.

    Returns:
        The newest complete entry's path, or ``None``.

    Raises:
        torchstep.files.UnsafePathError: the directory or one above it is unsafe.
    """
    path = os.fspath(directory)
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    check_ancestors(path)
    check_private_dir(path)
    # an entry's write bits matter to those who can reach it: the directory's search bits say who
    reach = os.lstat(path).st_mode
    writers = (0o020 if reach & 0o010 else 0) | (0o002 if reach & 0o001 else 0)
    best: tuple[int, str] | None = None
    try:
        entries = list(os.scandir(path))
    except (FileNotFoundError, NotADirectoryError):
        return None
    for entry in entries:
        if entry.name.startswith(".") or entry.name.endswith(INCOMPLETE_SUFFIXES):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:  # removed meanwhile (checkpoint rotation)
            continue
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            continue  # a symlink, a FIFO: never followed, never counted
        problem = _foreign(st, writers)
        if problem is not None:
            (warn or _warn)(
                f"checkpoint {entry.path} skipped: {problem}; fix: remove it (and check who can write {path})"
            )
            continue
        key = (st.st_mtime_ns, entry.name)
        if best is None or key > best:
            best = key
    return None if best is None else os.path.join(path, best[1])


def _foreign(st: os.stat_result, writers: int) -> str | None:
    """Why an entry is not one the caller could trust (``None``: it is); ``writers``: the
    write bits of those who can reach it."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): another user may have planted it"
    if st.st_mode & writers:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):04o}): someone else may have changed it"
    return None


def _warn(text: str) -> None:
    warnings.warn(text, CheckpointWarning, stacklevel=3)
