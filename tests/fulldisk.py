"""A really full filesystem for the tests: a small tmpfs mounted on a directory of the test
(tests run as root), so every write torchstep makes there fails with ENOSPC the way a full
disk makes it fail — not a monkeypatched ``open`` and not only ``/dev/full``.

    with full_tmpfs(tmp_path / "logs") as logs:   # 256 KiB, unmounted at the end
        fill(logs)                                # optional: full before the run starts
        ...

Skips the test (with the reason) where mounting is impossible: not root, no CAP_SYS_ADMIN
(an unprivileged container).
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

NO_SPACE = os.strerror(errno.ENOSPC)  # "No space left on device"


@contextmanager
def full_tmpfs(path: Path, size: str = "256k") -> Iterator[Path]:
    """Mount a ``size`` tmpfs on ``path`` (created) for the block; unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a really full disk) needs root; these tests run as root in CI")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}): no full-disk test possible")
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)  # still busy: detach it


def fill(path: Path) -> None:
    """Write a filler file into ``path`` until the filesystem is full."""
    with open(path / ".filler", "wb", buffering=0) as f:
        block = b"\0" * 4096
        try:
            while True:
                f.write(block)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
