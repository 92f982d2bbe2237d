"""Parse-time outcomes kept across processes, in the user's private cache
(:func:`remember`).

The Airflow dag-processor parses every DAG file in a fresh child process: each
``AppDefOperator`` of a string reference would import TorchX and torchstep's planner and
build its AppDef, every 30 s, for a file that did not change. :func:`remember` keeps what
the orchestrator needs from that work (its task settings, or the :class:`SpecError` that
makes the DAG an import error) as one small JSON file per task, so that a re-parse of an
unchanged file costs one ``stat`` of the component file and one small read per task, and
imports neither TorchX nor the planner.

An entry is used only when everything its outcome depends on is as it was:

- the component: for ``"path/file.py:fn"`` the file's version (absolute path, mtime,
  ctime, size, inode); for a TorchX builtin (``"dist.ddp"``) the version of its module file
  in TorchX; for a module-level component function, the version of the file that defines
  it. A ``"package.module:fn"`` reference, a closure, a lambda or a ready AppDef is never
  kept (computed every time, as without the store);
- the modules of your own code (outside the Python installation) that resolving the
  component imported first, each by its file version;
- the arguments as given (templated strings stay templates), the key the caller adds
  (target, task settings), the working directory;
- the versions of Python and of the installed torchstep and TorchX (their files' versions:
  an upgrade or a reinstall changes them), of the caller's own code (``code_files``), and in
  a source checkout of torchstep of every file of its planner;
- for each path the outcome depends on (the local target's images), whether it is a
  directory.

A failure is kept the same way, so an unchanged broken file fails just as fast and with
the same message; any change above computes afresh. The store lives in
``$XDG_CACHE_HOME/torchstep/plans`` (else ``~/.cache/torchstep/plans``), directories
``0700`` and files ``0600`` (:mod:`torchstep.files`); an entry that is not a regular file
owned by you with mode ``0600``, a symlink, or not valid JSON is ignored and rewritten.
``TORCHSTEP_PLAN_CACHE`` names another directory, or turns the store off (``0``).

Example::

    >>> import os, tempfile
    >>> os.environ["TORCHSTEP_PLAN_CACHE"] = tempfile.mkdtemp()
    >>> calls = []
    >>> def compute():
    ...     calls.append(1)
    ...     return {"retries": 2}, []
    >>> remember("doc", "utils.echo", {"args": ["--msg", "hi"]}, compute)
    {'retries': 2}
    >>> clear_memory()  # as in a fresh process
    >>> remember("doc", "utils.echo", {"args": ["--msg", "hi"]}, compute), len(calls)
    ({'retries': 2}, 1)
    >>> del os.environ["TORCHSTEP_PLAN_CACHE"]
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import threading
import types
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from torchstep.errors import SpecError
from torchstep.files import write_private

__all__ = ["ENV", "MAX_ENTRIES", "clear_memory", "component_key", "remember", "store_root"]

#: Environment variable: a directory for the store, or ``0`` / ``off`` to turn it off.
ENV = "TORCHSTEP_PLAN_CACHE"
#: Entries kept; past this, the oldest written half is removed (see :data:`PRUNE_EVERY`).
MAX_ENTRIES = 20_000
#: A process prunes the store on its first write, then on every this-many-th.
PRUNE_EVERY = 256
_FORMAT = 1
_OFF = ("0", "off", "false", "no")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)

#: one file version: (absolute path, mtime_ns, ctime_ns, size, inode)
FileVersion = tuple[str, int, int, int, int]

_lock = threading.Lock()
_writes = 0  # entries this process wrote (pruning counts them)
_ready: dict[tuple[str | None, ...], str] = {}  # the variables naming it -> the checked store ("": none)
_versions: list[str] = []  # digest of the code versions, computed once per process
_torchx_dir: list[str | None] = []
_references: dict[tuple[str, str], tuple[str, str]] = {}  # (reference, cwd) -> (label, its file)
_extra_deps: dict[str, set[str]] = {}  # component -> files of user modules resolving it imported


class _NotAKey(Exception):
    pass


def store_root(environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory of the store (not created), or ``None`` when it is off.

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        ``$TORCHSTEP_PLAN_CACHE`` when set to a path, ``None`` when set to ``0`` / ``off``;
        else ``$XDG_CACHE_HOME/torchstep/plans``, else ``~/.cache/torchstep/plans``; ``None``
        when there is no home directory (a shared temporary directory is never used).

    Example::

        >>> store_root({"XDG_CACHE_HOME": "/home/ada/.cache"}).as_posix()
        '/home/ada/.cache/torchstep/plans'
        >>> store_root({"TORCHSTEP_PLAN_CACHE": "off"}) is None
        True
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value:
        return Path(os.path.abspath(value))
    xdg = env.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "torchstep" / "plans"
    home = env.get("HOME") or os.path.expanduser("~")
    if home and os.path.isabs(home) and home != "/":
        return Path(home) / ".cache" / "torchstep" / "plans"
    return None


def _version(path: str) -> FileVersion:
    st = os.stat(path)
    return (path, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)


def _torchx_components() -> str | None:
    """TorchX's ``components`` directory, found without importing TorchX."""
    if not _torchx_dir:
        import importlib.util

        try:
            spec = importlib.util.find_spec("torchx")
            origin = spec.origin if spec is not None else None
        except (ImportError, ValueError):
            origin = None
        _torchx_dir.append(os.path.join(os.path.dirname(origin), "components") if origin else None)
    return _torchx_dir[0]


def component_key(component: Any) -> tuple[str, list[FileVersion]] | None:
    """What identifies ``component`` across processes, without importing it.

    Args:
        component: what ``materialize`` takes: a reference string or a component function.

    Returns:
        ``(label, file versions)``: the label names the component, the versions are those
        of the file that defines it; ``None`` when it cannot be identified that way (a
        ``"package.module:fn"`` reference, a missing file, a closure or lambda, an AppDef).
    """
    try:
        if isinstance(component, str):
            return _reference_key(component.strip())
        if isinstance(component, types.FunctionType):
            return _function_key(component)
    except OSError:
        return None
    return None


def _reference_key(ref: str) -> tuple[str, list[FileVersion]] | None:
    where = (ref, os.getcwd())
    found = _references.get(where)
    if found is None:
        found = _references[where] = _reference_file(ref)
    if not found[1]:
        return None
    return found[0], [_version(found[1])]


def _reference_file(ref: str) -> tuple[str, str]:
    """``(label, the file that defines it)`` for a reference string (``""``: none)."""
    path, sep, fn_name = ref.rpartition(":")
    if sep:  # the same split as materialize's _resolve
        if not path or ":" in path or not fn_name:
            return "", ""
        if not path.endswith(".py") and not os.path.exists(path) and "/" not in path:
            return "", ""  # "package.module:fn": finding its file would import its packages
        abspath = os.path.abspath(path)
        return f"file:{abspath}:{fn_name}", abspath
    module, _, fn_name = ref.rpartition(".")
    parts = module.split(".") if module else []
    components = _torchx_components()
    if components is None or not fn_name.isidentifier() or not all(p.isidentifier() for p in parts):
        return "", ""
    base = os.path.join(components, *parts)
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return f"builtin:{ref}", candidate
    return "", ""


def _function_key(fn: types.FunctionType) -> tuple[str, list[FileVersion]] | None:
    module = sys.modules.get(fn.__module__)
    if module is None or "<" in fn.__qualname__ or fn.__closure__ is not None:
        return None
    found: Any = module
    for part in fn.__qualname__.split("."):
        found = getattr(found, part, None)
    filename = fn.__code__.co_filename
    if found is not fn or not os.path.isabs(filename):
        return None  # not reachable by its name (replaced, generated): its code is not its file's
    return f"function:{fn.__module__}:{fn.__qualname__}", [_version(filename)]


def _code_versions(code_files: Sequence[str] = ()) -> list[str]:
    """A digest of Python's version and of the installed torchstep and TorchX — the versions
    of their ``__init__.py`` files: an upgrade or a reinstall writes new ones — and of
    ``code_files`` (the caller's own modules); in a source checkout of torchstep, also of
    every file of its planner and component loading (edited without a reinstall). Read
    without ``importlib.metadata``, which scans every installed distribution."""
    with _lock:
        if _versions:
            return _versions
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    components = _torchx_components()
    files = [os.path.join(package, "__init__.py"), *code_files]
    if components is not None:
        files.append(os.path.join(os.path.dirname(components), "__init__.py"))
    if not any(f"{os.sep}{d}{os.sep}" in package for d in ("site-packages", "dist-packages")):  # a checkout
        for sub in ("plan", os.path.join("plan", "rules"), "components"):
            d = os.path.join(package, sub)
            try:
                files += sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".py"))
            except OSError:
                continue
    out: list[Any] = [sys.version]
    for path in files:
        try:
            out.append(_version(path))
        except OSError:
            out.append(path)
    digest = hashlib.sha256(json.dumps(out).encode()).hexdigest()[:32]
    with _lock:
        if not _versions:
            _versions.append(digest)
        return _versions


def _canon(value: Any) -> Any:
    """``value`` as JSON that tells apart what renders differently (``1``, ``1.0``,
    ``True``, ``"1"``, a tuple and a list); :class:`_NotAKey` for anything else."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return value
    if kind is float:
        return {"f": repr(value)}
    if kind is list:
        return [_canon(v) for v in value]
    if kind is tuple:
        return {"t": [_canon(v) for v in value]}
    if kind is dict:
        return {"d": [[_canon(k), _canon(v)] for k, v in value.items()]}
    if kind is timedelta:
        return {"td": repr(value.total_seconds())}
    raise _NotAKey


def _uncanon(value: Any) -> Any:
    if isinstance(value, list):
        return [_uncanon(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "f" in value:
        return float(value["f"])
    if "t" in value:
        return tuple(_uncanon(v) for v in value["t"])
    if "td" in value:
        return timedelta(seconds=float(value["td"]))
    return {_uncanon(k): _uncanon(v) for k, v in value["d"]}


def _ready_root() -> str | None:
    """The store's directory, created private and checked once per process; ``None``
    when the store is off or its directory is not safe to use."""
    env = os.environ
    names = (env.get(ENV), env.get("XDG_CACHE_HOME"), env.get("HOME"))
    ready = _ready.get(names)
    if ready is not None:
        return ready or None
    root = store_root()
    if root is not None:
        from torchstep import files

        try:
            st = os.lstat(root)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
                files.check_ancestors(root)  # it exists, private: what private_dir would check
            else:
                files.private_dir(root)
        except FileNotFoundError:
            try:
                files.private_dir(root)
            except (OSError, ValueError):
                root = None
        except (OSError, ValueError):  # UnsafePathError is an OSError: computed every time
            root = None
    _ready[names] = str(root) if root is not None else ""
    return _ready[names] or None


def _user_files(names: Sequence[str]) -> set[str]:
    """The files of the modules ``names`` that are the user's code: outside the Python
    installation and not TorchX or torchstep (their versions are keyed already)."""
    installed = tuple({os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})
    out: set[str] = set()
    for name in names:
        if name.split(".", 1)[0] in ("torchx", "torchstep"):
            continue
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and os.path.isabs(path):
            if not os.path.realpath(path).startswith(installed):
                out.add(path)
    return out


def _valid(entry: Any, digest: str) -> bool:
    """Whether a stored entry is for the key ``digest`` and what it read is unchanged."""
    if not isinstance(entry, dict) or entry.get("key") != digest:
        return False
    try:
        for dep in entry["deps"]:
            if list(_version(dep[0])) != dep:
                return False
        for path, was_dir in entry["dirs"]:
            if os.path.isdir(path) != was_dir:
                return False
    except (OSError, TypeError, ValueError, KeyError, IndexError):
        return False
    return "outcome" in entry or isinstance(entry.get("error"), dict)


def _read(path: str) -> Any:
    """The JSON of an entry, or ``None`` (a miss): missing, torn, not JSON, or not what
    torchstep writes — a regular file owned by the caller with mode ``0600``, opened
    without following a symlink (:func:`torchstep.files.read_private`'s rules, read with
    fewer calls: one entry is read per task of a parse)."""
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o600:
            return None
        chunks = []
        while chunk := os.read(fd, max(st.st_size, 4096)):
            chunks.append(chunk)
        return json.loads(b"".join(chunks))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _raise_stored(error: dict[str, Any]) -> None:
    args = (error["field"], error["target"], error["problem"])
    if error.get("kind") == "unknown_parameter":
        from torchstep.components.builders import UnknownParameterError

        raise UnknownParameterError(*args, fix=error["fix"])
    raise SpecError(*args, fix=error["fix"])


def _write(root: str, path: str, entry: dict[str, Any]) -> None:
    """Write ``entry`` atomically (:func:`torchstep.files.write_private`, no fsync: a torn
    file after a crash is invalid JSON, which is a miss); the first write of each process,
    then every :data:`PRUNE_EVERY`-th, prunes the store."""
    global _writes
    try:
        if os.path.islink(path):  # planted: the link goes, its target is never written
            os.unlink(path)
        write_private(path, json.dumps(entry, separators=(",", ":")), fsync=False)
        _writes += 1
        if _writes % PRUNE_EVERY == 1:  # deterministic: bounded in short and long processes alike
            _prune(root)
    except OSError:
        pass  # the store is a cache: a full or read-only disk costs speed, never a parse


def _prune(root: str) -> None:
    entries = []
    with os.scandir(root) as it:
        for e in it:
            if e.name.endswith(".json") and e.is_file(follow_symlinks=False):
                entries.append((e.stat(follow_symlinks=False).st_mtime_ns, e.path))
    if len(entries) > MAX_ENTRIES:
        for _, p in sorted(entries)[: len(entries) // 2]:
            try:
                os.unlink(p)
            except OSError:
                pass


def remember(
    namespace: str,
    component: Any,
    key: Mapping[str, Any],
    compute: Callable[[], tuple[dict[str, Any], Sequence[str]]],
    code_files: Sequence[str] = (),
) -> dict[str, Any]:
    """``compute()``'s outcome for ``component`` and ``key``, kept across processes.

    Args:
        namespace: who computes and what (e.g. ``"airflow:AppDefOperator"``): outcomes of
            different callers never mix.
        component: the component the outcome is about (a reference string or a function;
            see :func:`component_key`). Anything else is computed every time.
        key: everything else the outcome depends on: the arguments as given, the target,
            settings. Values: ``None``, ``str``, ``int``, ``float``, ``bool``, ``timedelta``,
            and lists, tuples and dicts of them; anything else (an XComArg) is computed
            every time.
        compute: returns the outcome (a dict of such values) and the paths whose being a
            directory it depends on; may raise :class:`~torchstep.SpecError`, which is kept
            and raised again for the same inputs.
        code_files: the files of the caller's code that computes the outcome (its
            version is part of the key; read once per process).

    Returns:
        The outcome: ``compute()``'s, or the one kept for the same inputs.

    Raises:
        SpecError: what ``compute()`` raised for these inputs (now or when it was kept).
    """
    root = _ready_root()
    ident = component_key(component) if root is not None else None
    if ident is None or root is None:
        return compute()[0]
    label, deps = ident
    try:
        given = _canon(dict(key))
    except _NotAKey:
        return compute()[0]
    try:
        cwd = os.getcwd()
    except OSError:
        return compute()[0]
    material = json.dumps(
        [_FORMAT, namespace, label, deps, cwd, _code_versions(code_files), given], separators=(",", ":")
    )
    digest = hashlib.sha256(material.encode()).hexdigest()
    path = os.path.join(root, digest[:40] + ".json")
    entry = _read(path)
    if entry is not None and _valid(entry, digest):
        if "error" in entry:
            _raise_stored(entry["error"])
        return dict(_uncanon(entry["outcome"]))
    before = set(sys.modules)
    stored: dict[str, Any] = {"key": digest}
    try:
        outcome, dirs = compute()
    except SpecError as e:
        kind = "unknown_parameter" if type(e).__name__ == "UnknownParameterError" else "spec"
        if kind == "spec" and type(e) is not SpecError:
            raise  # a subclass we could not raise again as it was
        stored["error"] = {"kind": kind, "field": e.field, "target": e.target, "problem": e.problem, "fix": e.fix}
        dirs = []
        _finish(root, path, stored, label, before, dirs)
        raise
    try:
        stored["outcome"] = _canon(outcome)
    except _NotAKey:
        return outcome
    _finish(root, path, stored, label, before, dirs)
    return outcome


def _finish(root: str, path: str, stored: dict[str, Any], label: str, before: set[str], dirs: Sequence[str]) -> None:
    new = [n for n in sys.modules if n not in before]
    with _lock:
        extra = _extra_deps.setdefault(label, set())
        extra |= _user_files(new)
        extra_files = sorted(extra)
    try:
        stored["deps"] = [list(_version(p)) for p in extra_files]
        stored["dirs"] = [[p, os.path.isdir(p)] for p in dirs]
    except OSError:
        return
    _write(root, path, stored)


def clear_memory() -> None:
    """Forget what this process remembered about the store (tests; the files stay)."""
    with _lock:
        _ready.clear()
        _versions.clear()
        _torchx_dir.clear()
        _extra_deps.clear()
        _references.clear()
