"""What a torchstep TorchX scheduler submitted, kept so that ``torchx status``, ``log`` and
``cancel`` work from another process: one small JSON file per app under the per-user state
directory, ``<state_root>/torchx/<backend>/<app_id>.json`` (directories 0700, files 0600,
no symlink followed — :mod:`torchstep.files`).

A record holds where the app runs (endpoint, native ids, the *names* of the environment
variables holding credentials) — never a secret.

Example::

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> save("airflow", "train-1a2b3c", {"endpoint": "http://127.0.0.1:8080"}, root=root)
    >>> load("airflow", "train-1a2b3c", root=root)["endpoint"]
    'http://127.0.0.1:8080'
    >>> load("airflow", "../etc/passwd", root=root)
    Traceback (most recent call last):
    ...
    ValueError: app id '../etc/passwd' is not one this scheduler hands out (letters, digits, '-', '_', '.', ':'; no '/')
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from torchstep.files import private_dir, state_root, write_private

_APP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,250}")


def check_app_id(app_id: str) -> str:
    """``app_id`` when it is safe as a file name (what our schedulers hand out), else ValueError."""
    if not isinstance(app_id, str) or not _APP_ID.fullmatch(app_id) or ".." in app_id:
        raise ValueError(
            f"app id {app_id!r} is not one this scheduler hands out (letters, digits, '-', '_', '.', ':'; no '/')"
        )
    return app_id


def records_dir(backend: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``<state_root>/torchx/<backend>`` (created private on first use)."""
    return private_dir(Path(root or state_root()) / "torchx" / check_app_id(backend))


def save(backend: str, app_id: str, record: dict[str, Any], *, root: str | os.PathLike[str] | None = None) -> None:
    """Write (atomically) the record of ``app_id``."""
    path = records_dir(backend, root) / f"{check_app_id(app_id)}.json"
    write_private(path, json.dumps(record, indent=1, sort_keys=True))


def load(backend: str, app_id: str, *, root: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The record of ``app_id``, or ``None`` when this user never submitted it from here."""
    path = Path(root or state_root()) / "torchx" / backend / f"{check_app_id(app_id)}.json"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None
    with os.fdopen(fd) as f:
        data = json.load(f)
    return data if isinstance(data, dict) else None


def app_ids(backend: str, *, root: str | os.PathLike[str] | None = None) -> list[str]:
    """Every recorded app id of ``backend``, oldest first."""
    base = Path(root or state_root()) / "torchx" / backend
    try:
        entries = [e for e in os.scandir(base) if e.name.endswith(".json") and e.is_file(follow_symlinks=False)]
    except FileNotFoundError:
        return []
    return [e.name[: -len(".json")] for e in sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime)]
