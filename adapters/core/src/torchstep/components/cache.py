"""Per-process caches that make resolving a component cheap enough to do once per task of a DAG.

An Airflow dag-processor re-parses every DAG file in a fresh child process, and each
``AppDefOperator`` materialises and plans its AppDef while the file is parsed. TorchX's
``get_component`` costs ~50 ms per call: it scans every installed distribution's entry
points twice (``read_conf_file`` looks up a ``torchx.file`` plugin, even for a file that
exists) and re-lints and re-executes the component file; a builtin named by string lints
every builtin of TorchX first. Here each of those happens once:

- ``"path/file.py:fn"``: the file is read, linted (TorchX's own ``file_linter``, per
  function) and executed once per version — keyed by its absolute path, mtime, ctime,
  size and inode, so an edited file is read again; several functions of one file share
  one execution, as in a module. No entry point is scanned.
- ``"dist.ddp"``: imports ``torchx.components.dist`` and lints ``ddp`` alone, unless a
  ``[torchx.components]`` entry point is installed (then TorchX's finder decides, exactly
  as before); that check reads each distribution's ``entry_points.txt`` once per process.
- a component function: its signature and its annotation-evaluated form are kept per
  function object.
- :class:`LRU`: the bounded, thread-safe map behind the caches (and behind the plan cache
  of :func:`torchstep.components.plan_cache.materialize_and_plan`).

Errors are TorchX's own (``ComponentNotFoundException``, ``ComponentValidationException``,
the file's exception) with TorchX's messages; failures are never cached.
"""

from __future__ import annotations

import collections
import importlib
import inspect
import os
import re
import sys
import threading
import types
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Most component files / builtins / plans kept per process.
MAX_FILES = 256
MAX_BUILTINS = 256


_all_lrus: weakref.WeakSet[LRU[Any, Any]] = weakref.WeakSet()


class LRU(Generic[K, V]):
    """A small thread-safe least-recently-used map of at most ``maxsize`` entries.

    Args:
        maxsize: the most entries kept; the least recently used goes first.
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._data: collections.OrderedDict[K, V] = collections.OrderedDict()
        self._lock = threading.Lock()
        _all_lrus.add(self)  # so that clear() empties every cache built on this class

    def get(self, key: K) -> V | None:
        """The value under ``key`` (now the most recently used), or ``None``.

        Args:
            key: the entry's key.
        """
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used beyond ``maxsize``.

        Args:
            key: the entry's key.
            value: its value (``None`` reads back as a miss).
        """
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def pop(self, key: K) -> None:
        """Forget ``key`` (nothing happens when it is absent).

        Args:
            key: the entry's key.
        """
        with self._lock:
            self._data.pop(key, None)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._data.clear()

    def __len__(self) -> int:
        return len(self._data)


# -- TorchX's file linter, fed the source we read ----------------------------------------------
_tls = threading.local()
_install_lock = threading.Lock()


def _install_source_override() -> None:
    """Let ``file_linter.validate`` lint a source this thread already read.

    ``validate(path, fn)`` reads ``path`` with ``read_conf_file``, which scans every installed
    distribution for a ``torchx.file`` plugin before it returns the file's own contents. The
    wrapper returns the source this thread passed in for that very path (the file's contents,
    which is what ``read_conf_file`` returns for an existing file) and otherwise calls
    TorchX's function unchanged.
    """
    from torchx.specs import file_linter

    if getattr(file_linter.read_conf_file, "torchstep_override", False):
        return
    with _install_lock:
        original = file_linter.read_conf_file
        if getattr(original, "torchstep_override", False):
            return

        def read_conf_file(conf_file: str) -> str:
            sources = getattr(_tls, "sources", None)
            if sources and str(conf_file) in sources:
                return str(sources[str(conf_file)])
            return str(original(conf_file))

        read_conf_file.torchstep_override = True  # type: ignore[attr-defined]
        file_linter.read_conf_file = read_conf_file


def _lint(path: str, source: str, fn_name: str) -> list[str]:
    """TorchX's validation errors of ``fn_name`` in ``source`` (the file at ``path``)."""
    from torchx.specs.file_linter import validate

    _install_source_override()
    sources = getattr(_tls, "sources", None)
    if sources is None:
        sources = _tls.sources = {}
    sources[path] = source
    try:
        return [m.description for m in validate(path, fn_name)]
    finally:
        sources.pop(path, None)


# -- component files ------------------------------------------------------------------------------
@dataclass
class _FileEntry:
    path: str  # absolute
    source: str
    lint: dict[str, list[str]] = field(default_factory=dict)
    namespace: dict[str, Any] | None = None
    docs_checked: set[str] = field(default_factory=set)
    lock: threading.RLock = field(default_factory=threading.RLock)


_files: LRU[tuple[Any, ...], _FileEntry] = LRU(MAX_FILES)


def _file_key(abspath: str) -> tuple[Any, ...]:
    st = os.stat(abspath)
    return (abspath, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino, st.st_dev)


_files_lock = threading.Lock()  # one reader per file version, so its entry is executed once


def _file_entry(abspath: str) -> _FileEntry:
    key = _file_key(abspath)
    entry = _files.get(key)
    if entry is not None:
        return entry
    with _files_lock:
        entry = _files.get(key)
        if entry is None:
            with open(abspath) as f:  # as read_conf_file reads an existing file
                source = f.read()
            entry = _FileEntry(abspath, source)
            if _file_key(abspath) == key:  # else it changed while we read it: read it again next time
                _files.put(key, entry)
    return entry


def resolve_file(path: str, fn_name: str) -> Callable[..., Any]:
    """The function ``fn_name`` of the component file ``path``: what TorchX's
    ``get_component(f"{path}:{fn_name}").fn`` returns, with the same checks in the same
    order (lint, execute the file, find the function, report lint errors) and TorchX's
    exceptions, but each done once per version of the file.

    Args:
        path: the component file (``components/train.py``).
        fn_name: the component function's name in it.

    Returns:
        The function.

    Raises:
        Exception: what TorchX's ``get_component`` raises for the same file (a
            ``ComponentValidationException``, ``ComponentNotFoundException``...).
    """
    from torchx.specs import finder
    from torchx.specs.file_linter import get_fn_docstring

    abspath = os.path.abspath(path)
    entry = _file_entry(abspath)
    with entry.lock:
        errors = entry.lint.get(fn_name)
        if errors is None:
            errors = entry.lint[fn_name] = _lint(abspath, entry.source, fn_name)
        namespace = entry.namespace
        if namespace is None:
            # TorchX (nightly) executes the file in a copy of its finder module's globals, with
            # ``__file__`` pointing at the file; 0.7.0 used the finder's globals themselves,
            # which let two files' functions see each other's names.
            namespace = dict(vars(finder))
            namespace["__file__"] = abspath
            # dont_inherit: this module's ``from __future__ import annotations`` must not
            # turn the file's annotations into strings (TorchX compiles it without it).
            exec(compile(entry.source, abspath, "exec", dont_inherit=True), namespace)
            entry.namespace = namespace
        if fn_name not in namespace:
            raise finder.ComponentNotFoundException(f"Function {fn_name} does not exist in file {path}")
        fn = namespace[fn_name]
        if fn_name not in entry.docs_checked:
            get_fn_docstring(fn)  # TorchX reads it while finding the component: fails alike
            entry.docs_checked.add(fn_name)
    if errors:
        msg = "\n".join(errors)
        raise finder.ComponentValidationException(f"Component {path}:{fn_name} has validation errors: \n {msg}")
    return fn  # type: ignore[no-any-return]


# -- TorchX builtins by name -------------------------------------------------------------------
_builtins: LRU[str, Callable[..., Any]] = LRU(MAX_BUILTINS)
_custom_checked: list[tuple[tuple[str, ...], bool]] = []  # [(sys.path, found)], the last check
_CUSTOM_SECTION = re.compile(r"^\s*\[\s*torchx\.components\s*\]\s*$", re.MULTILINE)


def custom_components_registered() -> bool:
    """Whether any installed distribution declares ``[torchx.components]`` entry points
    (then TorchX lists those instead of its builtins). Reads each distribution's
    ``entry_points.txt`` once per process (and ``sys.path``): ~5 ms, against ~40 ms for a
    full entry point scan and ~1 s for TorchX's listing of every builtin.
    """
    key = tuple(sys.path)
    last = _custom_checked[-1] if _custom_checked else None
    if last is not None and last[0] == key:
        return last[1]
    found = _scan_directories(key)
    if found is None:  # a layout the plain scan does not cover: ask importlib.metadata
        found = _scan_distributions()
    _custom_checked[:] = [(key, found)]
    return found


#: Distribution finders that search the ``sys.path`` folders as :func:`_scan_directories` does
#: (the ``importlib_metadata`` backport, which TorchX imports, adds its own to ``sys.meta_path``).
_PATH_FINDERS = {("importlib_metadata", "MetadataPathFinder"), ("importlib.metadata", "MetadataPathFinder")}


def _declares_components(text: str | bytes | None) -> bool:
    if not text:
        return False
    if isinstance(text, bytes):
        if b"torchx.components" not in text:
            return False
        text = text.decode("utf-8", "replace")
    return "torchx.components" in text and _CUSTOM_SECTION.search(text) is not None


def _scan_directories(path: tuple[str, ...]) -> bool | None:
    """The ``*.dist-info`` / ``*.egg-info`` folders of the ``sys.path`` directories — where
    ``importlib.metadata`` finds distributions — read with plain ``os`` calls; ``None`` when
    something else could hold one (a zip or egg on the path, a finder of its own)."""
    import importlib.machinery

    for finder in sys.meta_path:
        if not hasattr(finder, "find_distributions") or finder is importlib.machinery.PathFinder:
            continue
        kind = finder if isinstance(finder, type) else type(finder)
        if (kind.__module__, kind.__name__) not in _PATH_FINDERS:
            return None
    for entry in path:
        folder = entry or "."
        if folder.lower().endswith(".egg") or os.path.isfile(folder):
            return None
        try:
            children = os.scandir(folder)
        except OSError:  # missing or unreadable: importlib.metadata skips it too
            continue
        with children:
            for child in children:
                if not child.name.lower().endswith((".dist-info", ".egg-info")):
                    continue
                try:
                    with open(os.path.join(child.path, "entry_points.txt"), "rb") as f:
                        text = f.read()
                except (FileNotFoundError, NotADirectoryError):  # none, or an old one-file egg-info
                    continue
                except OSError:
                    return None
                if _declares_components(text):
                    return True
    return False


def _scan_distributions() -> bool:
    import importlib.metadata

    for dist in importlib.metadata.distributions():
        try:
            text = dist.read_text("entry_points.txt")
        except Exception:  # an unreadable distribution: let TorchX decide
            return True
        if _declares_components(text):
            return True
    return False


def _direct_builtin(name: str) -> Callable[..., Any] | None:
    """``torchx.components.<module>.<fn>`` when it is a lint-clean function, else ``None``."""
    module_name, _, fn_name = name.rpartition(".")
    if not fn_name.isidentifier() or (module_name and not all(p.isidentifier() for p in module_name.split("."))):
        return None
    try:
        module = importlib.import_module("torchx.components" + (f".{module_name}" if module_name else ""))
    except Exception:
        return None
    fn = vars(module).get(fn_name)
    module_file = getattr(module, "__file__", None)
    if not inspect.isfunction(fn) or not module_file:
        return None
    abspath = os.path.abspath(module_file)
    try:
        entry = _file_entry(abspath)
    except OSError:
        return None
    with entry.lock:
        errors = entry.lint.get(fn_name)
        if errors is None:
            errors = entry.lint[fn_name] = _lint(abspath, entry.source, fn_name)
    return None if errors else fn


def resolve_builtin(name: str) -> Callable[..., Any]:
    """The function of TorchX builtin ``name`` (``"dist.ddp"``): ``get_component(name).fn``.

    Without ``[torchx.components]`` entry points TorchX's builtins are the functions of the
    ``torchx.components`` modules, named ``<module>.<function>``, that pass its linter: the
    one module is imported and the one function linted. Anything else (a plugin, an unknown
    or invalid name) goes to TorchX's finder, for its result and its error.

    Args:
        name: the builtin's name (``dist.ddp``, ``utils.echo``).

    Returns:
        The component function.

    Raises:
        Exception: what TorchX's finder raises for an unknown or invalid name.
    """
    fn = _builtins.get(name)
    if fn is not None:
        return fn
    fn = None if custom_components_registered() else _direct_builtin(name)
    if fn is None:
        from torchx.specs.finder import get_component

        fn = get_component(name).fn
    _builtins.put(name, fn)
    return fn


# -- per component function -------------------------------------------------------------------
@dataclass(frozen=True)
class FunctionInfo:
    """What :mod:`torchstep.components.builders` reads from a component function every call.

    Args:
        parameters: the function's parameters; ``None`` when its signature cannot be read.
        error: why the signature cannot be read (empty otherwise).
        evaluated: ``fn`` itself, or a wrapper whose signature has evaluated annotations.
    """

    parameters: Mapping[str, inspect.Parameter] | None  # None: no readable signature (``error`` says why)
    error: str
    evaluated: Callable[..., Any]  # ``fn`` itself, or a wrapper whose signature has evaluated annotations


_functions: weakref.WeakKeyDictionary[Any, FunctionInfo] = weakref.WeakKeyDictionary()
_functions_lock = threading.Lock()


def function_info(fn: Callable[..., Any], compute: Callable[[Callable[..., Any]], FunctionInfo]) -> FunctionInfo:
    """``compute(fn)``, kept while ``fn`` lives when ``fn`` is a plain Python function
    (whose signature does not change); computed every time for other callables.

    Args:
        fn: the component function.
        compute: what reads the function (called on a cache miss).

    Returns:
        The function's info.
    """
    if not isinstance(fn, types.FunctionType):
        return compute(fn)
    with _functions_lock:
        info = _functions.get(fn)
    if info is None:
        info = compute(fn)
        with _functions_lock:
            _functions[fn] = info
    return info


def clear() -> None:
    """Forget everything cached (tests; a long-lived process that wants a fresh look)."""
    for lru in list(_all_lrus):
        lru.clear()
    _custom_checked.clear()
    with _functions_lock:
        _functions.clear()
