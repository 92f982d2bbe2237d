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

#: Names of entries still being written (never a checkpoint).
INCOMPLETE_SUFFIXES = (".tmp", ".partial", ".incomplete")


def latest_checkpoint(directory: str | os.PathLike[str]) -> str | None:
    """The path of the newest complete checkpoint in ``directory`` (see the module
    docstring), or ``None`` when it holds none or does not exist."""
    best: tuple[int, str] | None = None
    try:
        entries = list(os.scandir(directory))
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
        key = (st.st_mtime_ns, entry.name)
        if best is None or key > best:
            best = key
    return None if best is None else os.path.join(os.fspath(directory), best[1])
