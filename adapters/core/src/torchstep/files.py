"""Private files and directories: where torchstep keeps run state and logs, and how it
creates them. Standard library only (the agent, the worker API and the launchers use it).

Logs hold tracebacks and values derived from the environment, so everything torchstep
creates is private to the user who runs it: directories ``0700``, files ``0600``, no
symlink followed when creating or opening them, and a directory owned by someone else is
refused with one clear line (:class:`UnsafePathError`), never trusted.

Nothing already on disk is trusted either: on every use, the directories torchstep keeps
state in must be real directories owned by the caller that nobody else can write, and the
directories above them must pass OpenSSH's ``StrictModes`` rule (:func:`check_ancestors`):
owned by root or the caller, not writable by group or others unless sticky (``/tmp``).
Otherwise another local user could rename a directory and put their own in its place.

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
    "LossyFile",
    "UnsafePathError",
    "check_ancestors",
    "check_private_dir",
    "check_private_tree",
    "open_private",
    "private_dir",
    "private_root",
    "read_private",
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

    Args:
        path: the path refused.
        problem: what is wrong with it (``is a symlink``).
        fix: what to do about it.

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

    Args:
        environ: the environment to read ``XDG_STATE_HOME`` from; ``None``: ``os.environ``.

    Returns:
        The directory's path.

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


def check_ancestors(path: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafePathError` unless every directory above ``path`` passes
    OpenSSH's ``StrictModes`` rule: owned by root or the caller, and not writable by group
    or others unless it is sticky (like ``/tmp``, where nobody may rename another's entry).

    Both chains are checked: the directories of ``path`` as written (where a symlink among
    them lives) and of ``path`` resolved (where they lead). ``path`` itself is not checked.

    Args:
        path: the path whose parents are checked (it need not exist).

    Raises:
        UnsafePathError: the first directory above ``path`` that fails the rule.

    Example::

        >>> check_ancestors("/tmp/anything")  # / and /tmp: root's, /tmp sticky
    """
    p = Path(os.path.abspath(os.fspath(path)))
    parent = p.parent
    chains = [*parent.parents, parent]
    try:
        resolved = Path(os.path.realpath(parent))
        chains += [*resolved.parents, resolved]
    except OSError:
        pass
    seen: set[Path] = set()
    for d in chains:
        if d in seen:
            continue
        seen.add(d)
        try:
            st = os.stat(d)
        except FileNotFoundError:
            continue  # not there yet: whoever creates it is checked when it is used
        except OSError as e:
            raise UnsafePathError(d, f"cannot be checked: {e.strerror}", "choose another directory") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafePathError(d, "is not a directory", "choose another directory")
        if st.st_uid not in (0, os.geteuid()):
            raise UnsafePathError(
                d,
                f"is owned by uid {st.st_uid}, neither root nor you (uid {os.geteuid()}): its owner could replace "
                "what torchstep keeps below it",
                f"choose a directory under one only you or root own (ask the owner of {d} otherwise)",
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePathError(
                d,
                f"is writable by {_writers(st.st_mode)} (mode {_mode(st.st_mode)}) and not sticky: anyone who can "
                "write it could replace what torchstep keeps below it",
                f"chmod go-w {d} (or chmod +t for a shared directory), or choose another directory",
            )


def check_private_dir(path: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafePathError` unless ``path`` is a real directory (not a symlink)
    owned by the caller that neither group nor others can write. Its mode is never changed
    here: a directory others can write is refused with the ``chmod`` that fixes it.

    Args:
        path: the directory.

    Raises:
        UnsafePathError: ``path`` is a symlink, not a directory, another user's, or
            writable by group or others.
    """
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        raise UnsafePathError(p, "does not exist", "create it or choose another directory") from None
    _check_own_dir(p, st)


def _check_own_dir(p: str | os.PathLike[str], st: os.stat_result, *, others_may_write: bool = False) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(p, "is a symlink (torchstep never follows one)", "use the real directory path")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(p, "is not a directory", "remove it or choose another directory")
    if st.st_uid != os.geteuid():
        raise UnsafePathError(
            p, f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})", "choose a directory you own"
        )
    if not others_may_write and st.st_mode & 0o022:
        raise UnsafePathError(
            p,
            f"is writable by {_writers(st.st_mode)} (mode {_mode(st.st_mode)}): they could plant files in it",
            f"chmod go-w {os.fspath(p)}",
        )


def check_private_tree(base: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """Raise :class:`UnsafePathError` unless every directory from ``base`` down to
    ``path`` (both included, all existing) is a real directory owned by the caller that
    neither group nor others can write, and the directories above ``base`` pass
    :func:`check_ancestors`. Called on every use of state kept under ``base``.

    Args:
        base: the top of the private tree (a state root).
        path: a directory at or below ``base``.

    Raises:
        UnsafePathError: the first directory that fails the rule.

    Example::

        >>> import tempfile
        >>> base = private_dir(os.path.join(tempfile.mkdtemp(), "state"))
        >>> check_private_tree(base, private_dir(base / "torchx" / "airflow", base=base))
    """
    top = Path(os.path.abspath(os.fspath(base)))
    target = Path(os.path.abspath(os.fspath(path)))
    if top != target and top not in target.parents:
        raise ValueError(f"{target} is not inside {top}")
    check_ancestors(top)
    for d in _chain(top, target):
        check_private_dir(d)


def _chain(upper: Path, lower: Path) -> list[Path]:
    """``upper``, the directories between, and ``lower`` (``upper`` is ``lower`` or above it)."""
    return [upper, *[q for q in reversed(lower.parents) if upper in q.parents], *([lower] if lower != upper else [])]


def _writers(mode: int) -> str:
    return " and ".join(w for w, bit in (("its group", 0o020), ("others", 0o002)) if mode & bit)


def _mode(mode: int) -> str:
    return f"{stat.S_IMODE(mode):04o}"


def private_dir(
    path: str | os.PathLike[str], *, mode: int = DIR_MODE, base: str | os.PathLike[str] | None = None
) -> Path:
    """Create ``path`` and any missing parents (each new one ``0700``) and return it.

    Every directory from ``base`` (default: ``path`` itself) down to ``path``, whether it
    existed or this call created it, must be a real directory (not a symlink) owned by the
    caller that neither group nor others can write; every existing directory above those
    must pass :func:`check_ancestors` (OpenSSH's ``StrictModes``: root's or the caller's,
    not writable by others unless sticky, like ``/home`` and ``/tmp``). Anything else raises
    :class:`UnsafePathError` before a directory is created under it. ``path`` is made
    ``0700`` (``mode``) when it already existed with read or search bits for others.

    Args:
        path: the directory to create or check.
        mode: the mode of every directory created (and of ``path`` when it was open to others).
        base: the top of the private chain; ``None``: ``path`` itself.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        UnsafePathError: a directory in the chain or above it fails the rule, or one
            cannot be created.

    Example::

        >>> import tempfile
        >>> root = tempfile.mkdtemp()
        >>> private_dir(os.path.join(root, "state", "torchx", "airflow"), base=os.path.join(root, "state")).name
        'airflow'
    """
    target = Path(os.path.abspath(os.fspath(path)))
    top = target if base is None else Path(os.path.abspath(os.fspath(base)))
    if top != target and top not in target.parents:
        raise ValueError(f"{target} is not inside {top}")
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
    # the shallowest directory that must be ours: `base`, or the first one this call creates
    first_ours = missing[-1] if missing and (missing[-1] == top or missing[-1] in top.parents) else top
    check_ancestors(first_ours)
    if first_ours not in missing:  # existing directories from `base` down: checked before anything is made in them
        for d in _chain(first_ours, probe):
            check_private_dir(d)
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
    st = os.lstat(target)
    _check_own_dir(target, st)
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(target, mode)
    return target


def private_root(path: str | os.PathLike[str]) -> Path:
    """A directory the user named (a log root): created like :func:`private_dir` when
    missing; when it exists it must be a real directory owned by the caller that neither
    group nor others can write, under directories that pass :func:`check_ancestors`. Its
    mode is otherwise left as the user set it (what torchstep creates inside is ``0700``).

    Args:
        path: the directory the user named.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        UnsafePathError: it is a symlink, another user's or writable by others, or a
            directory above it fails :func:`check_ancestors`.
    """
    p = Path(os.path.abspath(os.fspath(path)))
    try:
        os.lstat(p)
    except FileNotFoundError:
        return private_dir(p)
    except NotADirectoryError:
        raise UnsafePathError(p, "a parent is not a directory", "choose another directory") from None
    except PermissionError:
        raise UnsafePathError(p, "permission denied", "choose a directory you can write") from None
    check_ancestors(p)
    check_private_dir(p)
    if not os.access(p, os.W_OK | os.X_OK):
        raise UnsafePathError(p, "is not writable", "choose a directory you can write")
    return p


def open_private(path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open`` with mode ``0600``, ``O_NOFOLLOW`` and ``O_CLOEXEC``: a symlink planted
    at ``path`` raises :class:`UnsafePathError` instead of being followed.

    Args:
        path: the file.
        flags: ``os.open`` flags (write, create, truncate by default).

    Returns:
        The file descriptor.

    Raises:
        UnsafePathError: ``path`` is a symlink.
        OSError: any other failure to open it.
    """
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


def read_private(path: str | os.PathLike[str]) -> str:
    """The text of a file torchstep wrote with :func:`write_private`, read through the
    file descriptor it checked: opened with ``O_NOFOLLOW``, then ``fstat`` must show a
    regular file owned by the caller with mode ``0600``. Anything else (a symlink, a file
    another user planted, one others could have written) raises :class:`UnsafePathError`;
    a missing file raises ``FileNotFoundError``. Check the directories above it first
    (:func:`check_private_tree`).

    Args:
        path: the file.

    Returns:
        Its text.

    Raises:
        UnsafePathError: not a regular file of the caller's with mode ``0600``.
        FileNotFoundError: there is no such file.

    Example::

        >>> import tempfile
        >>> read_private(write_private(os.path.join(tempfile.mkdtemp(), "r.json"), "{}"))
        '{}'
    """
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(p, "is a symlink (torchstep never follows one)", "remove it") from None
        raise
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(p, "is not a regular file", "remove it")
        if st.st_uid != os.geteuid():
            raise UnsafePathError(
                p,
                f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): torchstep did not write it, "
                "another user may have planted it",
                "remove it (and check who can write its directory)",
            )
        if stat.S_IMODE(st.st_mode) != FILE_MODE:
            raise UnsafePathError(
                p,
                f"has mode {_mode(st.st_mode)}, not 0600: torchstep writes its files private",
                f"remove it (or chmod 600 {p} if you wrote it yourself)",
            )
        return f.read().decode("utf-8")


def write_private(path: str | os.PathLike[str], text: str, *, fsync: bool = True) -> str:
    """Write ``text`` atomically to ``path`` (``0600``; a temp file beside it, fsync,
    rename), so a reader never sees half a file. The parent directory must exist. The one
    atomic writer of torchstep (the plan store and the agent's reaper use it too).

    Args:
        path: the file.
        text: its whole content.
        fsync: flush it to disk before the rename; ``False`` for a cache, where a torn
            file after a power loss is invalid JSON, which is a miss.

    Returns:
        ``path`` as a ``str``.

    Raises:
        UnsafePathError: ``path`` is a symlink.
        OSError: the write or the rename failed (the temp file is removed).
    """
    p = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(p))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", dir=parent)  # mkstemp: 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            if fsync:
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


class LossyFile:
    """An append-only log file that survives write errors (disk full, file too large, I/O
    error): the first failure closes it and :attr:`lost` says why — ``log truncated:
    <path>: <reason>`` (or ``log not written: …`` when it could not even be opened) — and
    later writes are dropped, so a log never costs the run its outcome. Opened ``0600``
    with :func:`open_private` (a symlink is still refused: :class:`UnsafePathError`). One
    writer at a time (callers hold their own lock).

    Args:
        path: the log file.
        flags: ``os.open`` flags (append, create by default).

    Example::

        >>> import tempfile, os
        >>> log = LossyFile(os.path.join(tempfile.mkdtemp(), "agent.log"))
        >>> log.write(b"hello\\n"), log.lost
        (True, None)
    """

    def __init__(self, path: str | os.PathLike[str], flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> None:
        self.path = os.fspath(path)
        self.lost: str | None = None
        self._fd: int | None = None
        try:
            self._fd = open_private(self.path, flags)
        except UnsafePathError:
            raise
        except OSError as e:
            self.lost = f"log not written: {self.path}: {e.strerror or e}"

    def write(self, data: bytes) -> bool:
        """Append ``data`` (all of it, or up to the failure).

        Args:
            data: the bytes to append.

        Returns:
            ``True`` when written; ``False`` once the file is lost (see :attr:`lost`).
        """
        if self._fd is None:
            return False
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as e:
            self.lost = f"log truncated: {self.path}: {e.strerror or e}"
            self.close()
            return False
        return True

    def close(self) -> None:
        """Close the file (idempotent; a close error is ignored: the data was written)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
