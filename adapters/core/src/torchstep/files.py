"""Private files and directories: where torchstep keeps run state and logs, and how it
creates them. Standard library only (the agent, the worker API and the launchers use it).

Logs hold tracebacks and values derived from the environment, so everything torchstep
creates is private to the user who runs it: directories ``0700``, files ``0600``, no
symlink followed when creating or opening them, and a directory owned by someone else is
refused with one clear line (:class:`UnsafePathError`), never trusted.

The default root is per user: ``$XDG_STATE_HOME/torchstep``, else
``~/.local/state/torchstep``; when no home directory is usable, ``$TMPDIR/torchstep-<uid>``
created ``0700`` and verified to be owned by the caller.

Example::

    >>> import tempfile, os, stat
    >>> root = private_dir(os.path.join(tempfile.mkdtemp(), "runs", "r1"))
    >>> oct(stat.S_IMODE(os.stat(root).st_mode))
    '0o700'
    >>> path = write_private(os.path.join(root, "result.json"), "{}")
    >>> oct(stat.S_IMODE(os.stat(path).st_mode))
    '0o600'
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "UnsafePathError",
    "check_private_dir",
    "open_private",
    "private_dir",
    "private_root",
    "state_root",
    "write_private",
]

DIR_MODE = 0o700
FILE_MODE = 0o600
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePathError(OSError):
    """A path torchstep must not use: a symlink where a directory or file is created, a
    directory owned by another user, a file where a directory is expected, or one that
    cannot be created. ``str(err)`` is one line that names the path and the fix.

    Example::

        >>> str(UnsafePathError("/tmp/x", "is a symlink", "remove it or choose another directory"))
        '/tmp/x: is a symlink; fix: remove it or choose another directory'
    """

    def __init__(self, path: str | os.PathLike[str], problem: str, fix: str) -> None:
        self.path = os.fspath(path)
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.path}: {problem}; fix: {fix}")

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):  # keep pickling working (multiprocessing, Airflow)
        return (UnsafePathError, (self.path, self.problem, self.fix))


def state_root(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """The per-user state directory (not created): ``$XDG_STATE_HOME/torchstep``, else
    ``~/.local/state/torchstep``, else ``$TMPDIR/torchstep-<uid>`` when there is no home.

    Example::

        >>> state_root({"XDG_STATE_HOME": "/home/ada/.state"}).as_posix()
        '/home/ada/.state/torchstep'
    """
    env = os.environ if environ is None else environ
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):  # the XDG spec: a relative value is invalid, ignore it
        return Path(xdg) / "torchstep"
    home = env.get("HOME") or os.path.expanduser("~")
    if home and os.path.isabs(home) and home != "/":
        return Path(home) / ".local" / "state" / "torchstep"
    return Path(env.get("TMPDIR") or tempfile.gettempdir()) / f"torchstep-{os.getuid()}"


def check_private_dir(path: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a real directory (not a symlink)
    owned by the caller. Group/other permissions are tightened when we own it."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise UnsafePathError(p, "does not exist", "create it or choose another directory") from None
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(p, "is a symlink (torchstep never follows one)", "use the real directory path")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(p, "is not a directory", "remove it or choose another directory")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(
            p, f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})", "choose a directory you own"
        )


def private_dir(path: str | os.PathLike[str], *, mode: int = DIR_MODE) -> Path:
    """Create ``path`` and any missing parents (each new one ``0700``) and return it.

    Existing parents are used as they are (``/home``, ``/tmp``); every directory this call
    creates, and ``path`` itself, must be a real directory owned by the caller: a symlink
    or a foreign-owned directory raises :class:`UnsafePathError`. ``path`` is made
    ``0700`` (``mode``) even when it already existed.
    """
    target = Path(os.path.abspath(os.fspath(path)))
    missing: list[Path] = []
    probe = target
    while True:
        try:
            os.lstat(probe)
            break
        except FileNotFoundError:
            missing.append(probe)
            if probe.parent == probe:
                break
            probe = probe.parent
        except NotADirectoryError:
            raise UnsafePathError(probe, "a parent is not a directory", "choose another directory") from None
        except PermissionError:
            raise UnsafePathError(probe, "permission denied", "choose a directory you can write") from None
    if probe != target and probe not in missing:
        st = os.lstat(probe)
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(probe, "is not a directory", "choose another directory")
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            pass  # created concurrently: checked below like any existing directory
        except PermissionError:
            raise UnsafePathError(
                d, "cannot be created: permission denied", "choose a directory you can write"
            ) from None
        except OSError as e:
            raise UnsafePathError(d, f"cannot be created: {e.strerror}", "choose another directory") from None
        check_private_dir(d)
    check_private_dir(target)
    st = os.lstat(target)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(target, mode)
    return target


def private_root(path: str | os.PathLike[str]) -> Path:
    """A directory the user named (a log root): created like :func:`private_dir` when
    missing; when it exists it must be a real directory owned by the caller, and its mode
    is left as the user set it (what torchstep creates inside is ``0700``)."""
    p = Path(os.path.abspath(os.fspath(path)))
    try:
        os.lstat(p)
    except FileNotFoundError:
        return private_dir(p)
    except NotADirectoryError:
        raise UnsafePathError(p, "a parent is not a directory", "choose another directory") from None
    except PermissionError:
        raise UnsafePathError(p, "permission denied", "choose a directory you can write") from None
    check_private_dir(p)
    if not os.access(p, os.W_OK | os.X_OK):
        raise UnsafePathError(p, "is not writable", "choose a directory you can write")
    return p


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open`` with mode ``0600``, ``O_NOFOLLOW`` and ``O_CLOEXEC``: a symlink planted
    at ``path`` raises :class:`UnsafePathError` instead of being followed. Returns the fd."""
    p = os.fspath(path)
    try:
        fd = os.open(p, flags | _NOFOLLOW | _CLOEXEC, FILE_MODE)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(p, "is a symlink (torchstep never follows one)", "remove it") from None
        raise
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise UnsafePathError(p, f"is owned by uid {st.st_uid}, not by you", "remove it or choose another path")
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private(path: str | os.PathLike[str], text: str) -> str:
    """Write ``text`` atomically to ``path`` (``0600``; a temp file beside it, fsync,
    rename), so a reader never sees half a file. The parent directory must exist.
    Returns ``path``."""
    p = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(p))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", dir=parent)  # mkstemp: 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.path.islink(p):
            raise UnsafePathError(p, "is a symlink (torchstep never follows one)", "remove it")
        os.replace(tmp, p)  # replaces a planted symlink itself, never its target
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return p
