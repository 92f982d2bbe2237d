"""What a torchstep TorchX scheduler submitted, kept so that ``torchx status``, ``log`` and
``cancel`` work from another process: one small JSON file per app under the per-user state
directory, ``<state_root>/torchx/<backend>/<app_id>.json`` (directories 0700, files 0600,
no symlink followed — :mod:`torchstep.files`).

A record holds where the app runs (endpoint, native ids, the *names* of the environment
variables holding credentials) — never a secret. Since the scheduler sends the credential
of the variable a record names to the endpoint it names, a record is trusted only when
nobody else could have written it, checked on every read: every directory from the state
root down is the caller's and nobody else can write it (those above pass OpenSSH's
``StrictModes``), the file itself is the caller's with mode ``0600`` (``fstat`` of the
descriptor read, opened without following a symlink), and its endpoints and variable names
pass the rules they passed on submit. Anything else is a
:class:`~torchstep.files.UnsafePathError` naming the file or directory and the fix; nothing
is sent anywhere.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torchstep.files import UnsafePathError, check_private_tree, private_dir, read_private, state_root, write_private
from torchstep.schedulers.rules import CREDENTIAL_VARS, SECRET_VAR, url_problem

_APP_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,250}")


def check_app_id(app_id: str) -> str:
    """``app_id`` when it is safe as a file name (what our schedulers hand out), else ValueError."""
    if not isinstance(app_id, str) or not _APP_ID.fullmatch(app_id) or ".." in app_id:
        raise ValueError(
            f"app id {app_id!r} is not one this scheduler hands out (letters, digits, '-', '_', '.', ':'; no '/')"
        )
    return app_id


def records_dir(backend: str, root: str | os.PathLike[str] | None = None) -> Path:
    """``<state_root>/torchx/<backend>`` (created private on first use; every directory
    from the state root down checked on every use)."""
    base = Path(root or state_root())
    return private_dir(base / "torchx" / check_app_id(backend), base=base)


def save(backend: str, app_id: str, record: dict[str, Any], *, root: str | os.PathLike[str] | None = None) -> None:
    """Write (atomically) the record of ``app_id``."""
    path = records_dir(backend, root) / f"{check_app_id(app_id)}.json"
    write_private(path, json.dumps(record, indent=1, sort_keys=True))


def load(backend: str, app_id: str, *, root: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The record of ``app_id``, or ``None`` when this user never submitted it from here.
    Raises :class:`~torchstep.files.UnsafePathError` when the record, or a directory above
    it, could have been written by someone else, or names an endpoint or a variable that no
    scheduler would have stored (see the module docstring)."""
    base = Path(root or state_root())
    directory = base / "torchx" / check_app_id(backend)
    path = directory / f"{check_app_id(app_id)}.json"
    if not _exists(path):
        return None
    check_private_tree(base, directory)
    data = json.loads(read_private(path))
    if not isinstance(data, dict):
        return None
    check_record(data, path)
    return data


def app_ids(backend: str, *, root: str | os.PathLike[str] | None = None) -> list[str]:
    """Every recorded app id of ``backend``, oldest first (after the directory checks of
    :func:`load`: an unsafe directory raises instead of listing what someone planted)."""
    base = Path(root or state_root())
    directory = base / "torchx" / check_app_id(backend)
    if not _exists(directory):
        return []
    check_private_tree(base, directory)
    entries = [e for e in os.scandir(directory) if e.name.endswith(".json") and e.is_file(follow_symlinks=False)]
    return [e.name[: -len(".json")] for e in sorted(entries, key=lambda e: e.stat(follow_symlinks=False).st_mtime)]


def check_record(record: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """The checks a scheduler made before it stored ``record``, made again on reading it:
    every ``endpoint`` / ``*_endpoint`` value is an http(s) URL with a host and without
    credentials, query or fragment, and every credential option (``token_env``,
    ``api_key_env``... :data:`~torchstep.schedulers.rules.CREDENTIAL_VARS`) holds the *name*
    of an environment variable — the rules of :mod:`torchstep.schedulers.rules` that every
    scheduler checks on submit. A record failing them
    was not written by a scheduler: :class:`~torchstep.files.UnsafePathError` naming
    ``path`` and the key (never the value: it may be a secret)."""
    for key, value in _items(record):
        if value is None:
            continue
        if key == "endpoint" or key.endswith("_endpoint"):
            problem = url_problem(value)
        elif key in CREDENTIAL_VARS:
            ok = isinstance(value, str) and SECRET_VAR.fullmatch(value)
            problem = None if ok else "is not the name of an environment variable (value not shown)"
        else:
            continue
        if problem is not None:
            raise UnsafePathError(
                path,
                f"{key!r} {problem}: no torchstep scheduler stores that, so it is not trusted",
                "remove the record (and submit again: records are written by `torchx run` only)",
            )


def _items(value: Any) -> Iterator[tuple[str, Any]]:
    """Every ``(key, value)`` of a JSON object, nested objects included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key), item
            yield from _items(item)
    elif isinstance(value, list):
        for item in value:
            yield from _items(item)


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True
