"""Per-rank log files that are never deleted, and the tee that copies them line by line
to the agent's stdout with a ``[role/rank]`` prefix.

Layout under ``--log-dir`` (one directory per agent)::

    <log_dir>/agent.log                     the agent's own log
    <log_dir>/result.json                   the step result (also --result-file)
    <log_dir>/attempt_<k>/rank<N>.log       stdout + stderr of global rank N, in write order
    <log_dir>/attempt_<k>/rank<N>.error.json   the worker's error file (torchstep.record / @record)
    <log_dir>/attempt_<k>/rank<N>.outputs.json torchstep.output() values

``k`` counts the worker-group starts of this agent (0, 1, ...: restarts and membership
changes). Directories are claimed with ``mkdir``, so a reused or shared log dir continues
the numbering instead of overwriting anything.

A worker never writes its log file itself: its stdout (and stderr) is a pipe — a FIFO in the
agent's private run directory that torch opens like a file — and :class:`LogTee` copies
what comes through into the log file, onto the console and into the rank's in-memory tail.
So a log that cannot be written (a full disk, a file too large, an I/O error) is truncated
(the result's ``warnings`` say so) while the worker, the console and the root cause's tail
go on as if nothing happened. Without a pipe (none could be made) the worker writes the
file and the tee reads it back, as torchrun does.

Example::

    >>> import tempfile
    >>> from torchstep.agent.logs import TorchstepLogsSpecs
    >>> specs = TorchstepLogsSpecs(tempfile.mkdtemp(), merge_streams=True)
    >>> envs = {0: {"RANK": "4"}, 1: {"RANK": "5"}}
    >>> dest = specs.reify(envs)
    >>> [p.rsplit("/", 2)[-2:] for p in dest.stdouts.values()]
    [['attempt_0', 'rank4.log'], ['attempt_0', 'rank5.log']]
    >>> envs[1]["TORCHELASTIC_ERROR_FILE"].endswith("attempt_0/rank5.error.json")
    True
"""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import select
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from string import Template
from typing import TextIO

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from torchstep.contract import ENV_ERROR_FILE as ERROR_FILE_ENV
from torchstep.files import DIR_MODE, LossyFile, UnsafePathError, open_private, private_dir, private_root
from torchstep.result import TAIL_LINES

#: Called with one line (``log truncated: <path>: <reason>``) when a log cannot be written.
WarningCallback = Callable[[str], None]
#: Capacity asked for each worker's pipe (the kernel may give less): a chatty worker runs
#: ahead of the tee by this much before a write of its waits.
_PIPE_SIZE = 1 << 20
#: The tee drains what the workers left in their pipes for at most this long at its stop.
_DRAIN_S = 20.0

#: ``[role/rank] `` — the default prefix of a rank's line on the agent's stdout.
DEFAULT_PREFIX_TEMPLATE = "[${role_name}/${rank}] "
_MAX_PARTIAL = 64 * 1024  # a "line" longer than this is emitted in pieces


@dataclass(frozen=True)
class RankPaths:
    """Where one worker's files live in one attempt.

    Example: ``rank_paths("/logs/attempt_0", 3, merge_streams=True).error`` is
    ``"/logs/attempt_0/rank3.error.json"``.
    """

    log: str
    stderr: str | None  # only when stderr cannot be merged into ``log`` (function entrypoints)
    error: str
    outputs: str


def rank_paths(
    attempt_dir: str, rank: int | str, *, merge_streams: bool, local_rank: int | None = None, layout: str = "torchstep"
) -> RankPaths:
    """The files of global rank ``rank`` (local rank ``local_rank``) in ``attempt_dir``:
    ``rank<N>.log`` etc. (pipelines), or torchrun's ``<local_rank>/stdout.log`` etc.

    Example::

        >>> rank_paths("/logs/attempt_1", 0, merge_streams=True).log
        '/logs/attempt_1/rank0.log'
        >>> rank_paths("/logs/r_x/attempt_0", 3, merge_streams=False, local_rank=1, layout="torchrun").stderr
        '/logs/r_x/attempt_0/1/stderr.log'
    """
    if layout == "torchrun":
        d = os.path.join(attempt_dir, str(local_rank if local_rank is not None else rank))
        return RankPaths(
            log=os.path.join(d, "stdout.log"),
            stderr=None if merge_streams else os.path.join(d, "stderr.log"),
            error=os.path.join(d, "error.json"),
            outputs=os.path.join(d, "outputs.json"),
        )
    base = os.path.join(attempt_dir, f"rank{rank}")
    return RankPaths(
        log=f"{base}.log",
        stderr=None if merge_streams else f"{base}.stderr.log",
        error=f"{base}.error.json",
        outputs=f"{base}.outputs.json",
    )


@dataclass
class RankPipe:
    """One worker stream as a pipe: the FIFO torch opens for the worker, the agent's ends
    of it (``read_fd``, and ``keep_fd``, a write end that keeps the pipe from reporting
    end-of-file between workers), and the log file the tee copies it into (``sink``).

    Example: ``specs.pipes[0]["out"].sink.path`` is ``".../attempt_0/rank0.log"``.
    """

    fifo: str
    read_fd: int
    keep_fd: int
    sink: LossyFile

    def close(self) -> None:
        for fd in (self.read_fd, self.keep_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self.sink.close()


def open_pipe(fifo: str, log_path: str) -> RankPipe | None:
    """A :class:`RankPipe` at ``fifo`` (made ``0600``) copied into ``log_path``, or ``None``
    when no FIFO can be made there (the worker then writes ``log_path`` itself). Raises
    :class:`~torchstep.files.UnsafePathError` for a symlink planted at ``log_path``.

    Example: ``open_pipe("/run/agent-x/attempt_0.0.out", "/logs/attempt_0/rank0.log")``.
    """
    read_fd = keep_fd = -1
    try:
        os.mkfifo(fifo, 0o600)
        read_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        keep_fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        for fd in (read_fd, keep_fd):
            if fd >= 0:
                os.close(fd)
        return None
    try:
        fcntl.fcntl(read_fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), _PIPE_SIZE)
    except OSError:  # over the per-user pipe budget: the default 64 KiB still works
        pass
    try:
        sink = LossyFile(log_path)
    except BaseException:
        os.close(read_fd)
        os.close(keep_fd)
        raise
    return RankPipe(fifo, read_fd, keep_fd, sink)


class TorchstepLogsSpecs(LogsSpecs):
    """torch ``LogsSpecs`` with a predictable layout that never deletes a file.

    torch's ``DefaultLogsSpecs`` names attempts by restart count and ``rmtree``s the
    attempt directory when a membership change starts the group again with the same
    count; here every group start gets a new ``attempt_<k>``. Console output is done by
    :class:`LogTee`, so no torch tee is configured.

    Example: ``LocalElasticAgent(spec, TorchstepLogsSpecs("/logs", merge_streams=True))``.
    """

    def __init__(
        self,
        log_dir: str,
        *,
        merge_streams: bool,
        layout: str = "torchstep",
        run_id: str | None = None,
        inner: LogsSpecs | None = None,
        pipe_dir: str | None = None,
        on_warning: WarningCallback | None = None,
    ) -> None:
        private_root(log_dir)  # created 0700 when missing; a symlink or another user's dir is refused
        if layout == "torchrun":  # torchrun's <log_dir>/<run_id>_<random>/attempt_<n>/<local_rank>/
            log_dir = tempfile.mkdtemp(prefix=f"{run_id or 'none'}_", dir=log_dir)
        super().__init__(log_dir=log_dir)
        self.merge_streams = merge_streams
        self.layout = layout
        #: A ``--logs-specs`` class of the user's: it decides where each rank's streams go
        #: (and tees them itself, as under torchrun); the agent reads what it returns.
        self.inner = inner
        self.dests: dict[int, RankPaths] = {}
        #: Where the workers' FIFOs go (the agent's private run directory); ``None``: no pipes.
        self.pipe_dir = pipe_dir
        #: The last :meth:`reify`'s pipes per local rank (``"out"``, and ``"err"`` for split
        #: streams): the agent hands them to its :class:`LogTee`.
        self.pipes: dict[int, dict[str, RankPipe]] = {}
        self._warn = on_warning or (lambda _text: None)
        self._next = 0
        self._pending: str | None = None

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def begin_attempt(self) -> str:
        """Claim the next free ``attempt_<k>`` directory (used by the next :meth:`reify`)."""
        while True:
            path = os.path.join(self.root_log_dir, f"attempt_{self._next}")
            self._next += 1
            try:
                os.mkdir(path, DIR_MODE)
            except FileExistsError:
                continue
            except OSError as e:  # a full disk: the run goes on, its logs are not written
                self._warn(f"log not written: {path}: {e.strerror or e}")
            self._pending = path
            return path

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        attempt_dir = self._pending or self.begin_attempt()
        self._pending = None
        if self.inner is not None:
            return self._reify_inner(attempt_dir, envs)
        # --duplicate-*-filters are applied by LogTee (into filtered.log): torch's copies are unused
        dest = LogsDest(filtered_stdout=os.devnull, filtered_stderr=os.devnull)
        self.close_pipes()  # a previous start that never reached the tee
        tag = os.path.basename(attempt_dir)
        for local_rank in range(len(envs)):
            paths = self.paths(attempt_dir, envs[local_rank].get("RANK", local_rank), local_rank)
            self._log_dir_of(paths.log)
            pipes: dict[str, RankPipe] = {}
            for stream, path in (("out", paths.log), ("err", paths.stderr)):
                if not path:
                    continue
                pipe = (
                    open_pipe(os.path.join(self.pipe_dir, f"{tag}.{local_rank}.{stream}"), path)
                    if self.pipe_dir
                    else None
                )
                if pipe is not None:
                    pipes[stream] = pipe
                    if pipe.sink.lost:
                        self._warn(pipe.sink.lost)
                else:  # the worker writes the file: created 0600 first, torch opens it "w" and keeps the mode
                    self._create(path)
            self.pipes[local_rank] = pipes
            dest.stdouts[local_rank] = pipes["out"].fifo if "out" in pipes else paths.log
            # "" = inherit the agent's stderr: the exec wrapper then points it at the log
            dest.stderrs[local_rank] = pipes["err"].fifo if "err" in pipes else (paths.stderr or "")
            dest.error_files[local_rank] = paths.error
            envs[local_rank][ERROR_FILE_ENV] = paths.error
        return dest

    def _log_dir_of(self, path: str) -> None:
        try:
            private_dir(os.path.dirname(path))
        except UnsafePathError as e:
            if not e.problem.startswith("cannot be created"):
                raise  # a symlink, another user's directory: refused, never written through
            self._warn(f"log not written: {path}: {e.problem}")

    def _create(self, path: str) -> None:
        try:
            os.close(open_private(path, os.O_WRONLY | os.O_CREAT))
        except UnsafePathError:
            raise
        except OSError as e:
            self._warn(f"log not written: {path}: {e.strerror or e}")

    def close_pipes(self) -> None:
        """Close the pipes no tee took over."""
        for pipes in self.pipes.values():
            for pipe in pipes.values():
                pipe.close()
        self.pipes = {}

    def _reify_inner(self, attempt_dir: str, envs: dict[int, dict[str, str]]) -> LogsDest:
        assert self.inner is not None
        dest = self.inner.reify(envs)
        self.dests = {}
        for local_rank in range(len(envs)):
            ours = self.paths(attempt_dir, envs[local_rank].get("RANK", local_rank), local_rank)
            private_dir(os.path.dirname(ours.outputs))  # torchstep.output() still lands here
            self.dests[local_rank] = RankPaths(
                log=dest.stdouts.get(local_rank) or "",
                stderr=dest.stderrs.get(local_rank) or None,
                error=dest.error_files.get(local_rank) or ours.error,
                outputs=ours.outputs,
            )
        return dest

    def paths(self, attempt_dir: str, rank: int | str, local_rank: int) -> RankPaths:
        """:func:`rank_paths` in this spec's layout."""
        return rank_paths(
            attempt_dir, rank, merge_streams=self.merge_streams, local_rank=local_rank, layout=self.layout
        )

    def __repr__(self) -> str:
        return f"TorchstepLogsSpecs(root_log_dir={self.root_log_dir!r}, merge_streams={self.merge_streams})"


def line_prefix(template: str | None, *, role: str, rank: int, local_rank: int) -> str:
    """The console prefix of a rank (torch's ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` macros).

    Example::

        >>> line_prefix(None, role="trainer", rank=3, local_rank=1)
        '[trainer/3] '
    """
    return Template(template or DEFAULT_PREFIX_TEMPLATE).safe_substitute(
        role_name=role, rank=rank, local_rank=local_rank
    )


def tail_lines(path: str, n: int, *, max_bytes: int = 256 * 1024) -> list[str]:
    """The last ``n`` lines of a file (reads at most ``max_bytes`` from its end).

    Example::

        >>> import tempfile
        >>> f = tempfile.NamedTemporaryFile("w", delete=False); _ = f.write("a\\nb\\nc\\n"); f.close()
        >>> tail_lines(f.name, 2)
        ['b', 'c']
    """
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read()
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is cut
    return lines[-n:] if n > 0 else []


@dataclass
class TeeSource:
    """One rank's stream to copy to the console: its :class:`RankPipe` (copied into the log
    file as well), or, without one, its log file (read back as the worker writes it).
    ``tail`` keeps its last lines, whatever became of the file.

    Example: ``TeeSource("/logs/attempt_0/rank1.log", "[trainer/1] ", echo=True)``.
    """

    path: str
    prefix: str
    echo: bool = True
    to_stderr: bool = False  # copied to the console's stderr (a worker's own stderr)
    pipe: RankPipe | None = None
    tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=TAIL_LINES))
    _fd: int | None = field(default=None, repr=False)
    _buf: bytes = field(default=b"", repr=False)


#: Writes of at most this many bytes to a pipe are atomic (POSIX PIPE_BUF on Linux).
_PIPE_BUF = 4096


class LogTee:
    """Copies rank log files to ``dst`` line by line with a prefix, from one thread.

    Complete lines only (a partial line waits for its newline, so two writes of one
    ``print`` never come out as two prefixed pieces); at :meth:`stop` everything left is
    drained, so no line is lost. Lines that match ``filters`` are also appended to
    ``filter_file`` (torchrun's ``--duplicate-stdout-filters``).

    Example::

        tee = LogTee([TeeSource("/logs/attempt_0/rank0.log", "[trainer/0] ")])
        tee.start()
        ...
        tee.stop()
    """

    def __init__(
        self,
        sources: list[TeeSource],
        dst: TextIO | None = None,
        *,
        err_dst: TextIO | None = None,
        interval: float = 0.1,
        filters: list[str] | None = None,
        filter_file: str | None = None,
        on_warning: WarningCallback | None = None,
    ) -> None:
        self._sources = sources
        self._dst = dst if dst is not None else sys.stdout
        self._err_dst = err_dst if err_dst is not None else (dst if dst is not None else sys.stderr)
        self._err_ok = True
        self._interval = interval
        self._filters = filters or []
        self._filter_file = filter_file if self._filters else None
        self._filtered: LossyFile | None = None
        self._warn = on_warning or (lambda _text: None)
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._dst_ok = True

    def start(self) -> LogTee:
        self._thread = threading.Thread(target=self._run, name="torchstep-tee", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Drain every stream to its end and stop (idempotent)."""
        self._stop.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        elif self._wake_r >= 0:  # never started: nothing else closes these
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = -1

    def _wait(self) -> None:
        """Until a pipe has data, :meth:`stop` is called, or the interval passed (files)."""
        poll = select.poll()
        poll.register(self._wake_r, select.POLLIN)
        for src in self._sources:
            if src.pipe is not None:
                poll.register(src.pipe.read_fd, select.POLLIN)
        files = any(src.pipe is None for src in self._sources)
        try:
            poll.poll(1000 * (self._interval if files else 1.0))
        except OSError:
            time.sleep(self._interval)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wait()
                self._pump_safely()
            deadline = time.monotonic() + _DRAIN_S  # drain to the end: a rank may have written MiBs just before it died
            while self._pump_safely() and time.monotonic() < deadline:
                pass
            self._pump_safely(final=True)
        finally:
            for src in self._sources:
                if src._fd is not None:
                    os.close(src._fd)
                    src._fd = None
                if src.pipe is not None:
                    src.pipe.close()  # a writer left behind (a daemon) gets EPIPE, never blocks us
            if self._filtered is not None:
                self._filtered.close()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)

    def _warn_once(self, text: str | None) -> None:
        if text and text not in self._warned:
            self._warned.add(text)
            self._warn(text)

    def _pump_safely(self, *, final: bool = False) -> bool:
        """:meth:`_pump`, never raising: a worker blocks on a full pipe if the tee stops reading."""
        try:
            return self._pump(final=final)
        except Exception as e:  # a bug here must not hang the workers
            self._warn_once(f"the console copy of the rank logs failed: {type(e).__name__}: {e}")
            return False

    def _write(self, dst: TextIO, lines: list[str]) -> None:
        """Write whole lines in pieces of at most ``PIPE_BUF`` bytes straight to the fd:
        such a write to a pipe is atomic, so a log record another thread writes to stderr
        (often the same pipe) lands between two lines, never inside one."""
        try:
            fd = dst.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: an in-memory stream
            dst.write("".join(lines))
            dst.flush()
            return
        dst.flush()  # what others wrote through the stream goes first
        piece: list[bytes] = []
        size = 0
        for line in lines:
            data = line.encode("utf-8", "replace")
            if piece and size + len(data) > _PIPE_BUF:
                _write_all(fd, b"".join(piece))
                piece, size = [], 0
            piece.append(data)
            size += len(data)
        if piece:
            _write_all(fd, b"".join(piece))

    def _read(self, src: TeeSource) -> bool:
        """Take what ``src`` holds now (a bounded amount) into its buffer; whether any was read.
        A pipe's bytes go to its log file first (truncated, with a warning, once it fails)."""
        got = False
        if src.pipe is not None:
            fd = src.pipe.read_fd
        else:
            if src._fd is None:
                try:
                    src._fd = os.open(src.path, os.O_RDONLY)
                except FileNotFoundError:
                    return False
            fd = src._fd
        for _ in range(64):  # bounded per pass: one chatty rank cannot starve the others
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                raise
            if not chunk:
                break
            got = True
            src._buf += chunk
            if src.pipe is not None and not src.pipe.sink.write(chunk):
                self._warn_once(src.pipe.sink.lost)
        return got

    def _pump(self, *, final: bool) -> bool:
        """Copy what the streams hold now (a bounded amount per stream); whether any was read."""
        got = False
        out: list[str] = []
        err: list[str] = []
        filtered: list[str] = []
        for src in self._sources:
            got = self._read(src) or got
            lines = src._buf.split(b"\n")
            src._buf = lines.pop()
            if src._buf and (final or len(src._buf) > _MAX_PARTIAL):
                lines.append(src._buf)
                src._buf = b""
            for raw in lines:
                # progress bars rewrite a line with \r: show what a terminal would show
                if b"\r" in raw:
                    raw = next((seg for seg in reversed(raw.split(b"\r")) if seg), b"")
                text = raw.decode("utf-8", "replace")
                src.tail.append(text)
                if src.echo:
                    (err if src.to_stderr else out).append(f"{src.prefix}{text}\n")
                if self._filter_file and any(needle in text for needle in self._filters):
                    filtered.append(f"{src.prefix}{text}\n")
        if out and self._dst_ok:
            try:
                self._write(self._dst, out)
            except (BrokenPipeError, ValueError, OSError):
                self._dst_ok = False  # console gone: the files still hold everything
        if err and self._err_ok:
            try:
                self._write(self._err_dst, err)
            except (BrokenPipeError, ValueError, OSError):
                self._err_ok = False
        if filtered and self._filter_file:
            if self._filtered is None:
                self._filtered = LossyFile(self._filter_file)
            if not self._filtered.write("".join(filtered).encode("utf-8", "replace")):
                self._warn_once(self._filtered.lost)
                self._filter_file = None
        return got


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
