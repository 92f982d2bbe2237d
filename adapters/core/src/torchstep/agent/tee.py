"""The tee: copies each worker's stream into its log file, onto the agent's console (with
a ``[role/rank]`` prefix when asked) and into the rank's in-memory tail, from one thread.

The copy works on bytes end to end: a chunk read from a worker's pipe is appended to its
log file as read, cut at its last newline, prefixed with one ``bytes.replace`` over the
whole chunk and written to the console in as few writes as keep lines whole; only the last
:data:`~torchstep.result.TAIL_LINES` lines of a chunk are kept, still as bytes, and decoded
when the root cause reads them. Per-line Python work is left for the rare lines that need
it (a progress bar's ``\\r``, the ``--duplicate-*-filters``), so a rank printing thousands of
lines a second costs the agent little CPU.

Example::

    tee = LogTee([TeeSource("/logs/attempt_0/rank0.log", "[trainer/0] ")])
    tee.start()
    ...
    tee.stop()
"""

from __future__ import annotations

import collections
import os
import select
import stat
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO, overload

from torchstep.agent.logs import RankPipe, WarningCallback
from torchstep.files import LossyFile
from torchstep.result import TAIL_LINES
from torchstep.untrusted import MAX_TAIL_LINE_BYTES, escape_control_bytes

#: What ends a tail line longer than :data:`~torchstep.untrusted.MAX_TAIL_LINE_BYTES`.
_CUT = f" … [line cut at {MAX_TAIL_LINE_BYTES} bytes]".encode()

#: The tee drains what the workers left in their pipes for at most this long at its stop.
_DRAIN_S = 20.0
_MAX_PARTIAL = 64 * 1024  # a "line" longer than this is emitted in pieces
_READ = 1 << 16  # bytes per read; at most _READS reads per stream and pass
_READS = 64
#: Writes of at most this many bytes to a pipe are atomic (POSIX PIPE_BUF on Linux).
_PIPE_BUF = 4096
#: After a pass that copied a little, the tee waits this long before the next one, so a
#: rank printing line by line is copied in batches (one wake-up per batch, not per line);
#: torchrun's tee polls its files every 100 ms.
_BATCH_S = 0.05
#: ... unless a stream gave this much in one pass: a flood is copied without a pause.
_BATCH_BYTES = 32 * 1024


class LineTail:
    """The last ``maxlen`` lines of a stream, kept as the bytes read and decoded (UTF-8,
    invalid bytes replaced) only when read: iterating, indexing and ``len`` give ``str``
    lines, like the ``deque[str]`` it replaces. Each line is cut to
    :data:`~torchstep.untrusted.MAX_TAIL_LINE_BYTES` bytes (and a marker), so the tail of a
    rank that prints one endless line costs at most ``maxlen`` times that.

    Args:
        maxlen: how many lines to keep.

    Example::

        >>> t = LineTail(2)
        >>> t.extend([b"a", b"b", b"\\xffc"]); list(t), len(t), t[-1]
        (['b', '\\ufffdc'], 2, '\\ufffdc')
    """

    __slots__ = ("_lines", "_open")

    def __init__(self, maxlen: int = TAIL_LINES) -> None:
        self._lines: collections.deque[bytes] = collections.deque(maxlen=maxlen)
        self._open = False  # the last line had no newline yet: the next extend continues it

    def extend(self, lines: list[bytes], *, whole: bool = True, open_end: bool = False) -> None:
        """Append raw lines (without their newline), dropping the oldest beyond ``maxlen``.

        Args:
            lines: the lines, oldest first.
            whole: ``lines[0]`` starts where the previous extend ended (``False``: the
                oldest lines were left out).
            open_end: the last line has not ended yet (a piece of a line too long to wait
                for): the next extend's first line continues it.
        """
        if self._open and whole and lines and self._lines:
            first, lines = lines[0], lines[1:]
            prev = self._lines[-1]
            if not prev.endswith(_CUT):
                self._lines[-1] = _cap(prev + first[: MAX_TAIL_LINE_BYTES + 1])
        self._lines.extend(_cap(line) for line in lines)
        self._open = open_end

    def append(self, line: bytes | str) -> None:
        """Append one line (``str`` is stored encoded).

        Args:
            line: the line, without its newline.
        """
        self._lines.append(line.encode("utf-8", "replace") if isinstance(line, str) else line)

    def __iter__(self) -> Iterator[str]:
        return (line.decode("utf-8", "replace") for line in list(self._lines))

    def __len__(self) -> int:
        return len(self._lines)

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return list(self)[index]
        return self._lines[index].decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"LineTail({list(self)!r})"


@dataclass
class TeeSource:
    """One rank's stream to copy to the console: its :class:`~torchstep.agent.logs.RankPipe`
    (copied into the log file as well), or, without one, its log file (read back as the
    worker writes it). ``tail`` keeps its last lines, whatever became of the file.

    Example: ``TeeSource("/logs/attempt_0/rank1.log", "[trainer/1] ", echo=True)``.
    """

    path: str
    prefix: str
    echo: bool = True
    to_stderr: bool = False  # copied to the console's stderr (a worker's own stderr)
    pipe: RankPipe | None = None
    tail: LineTail = field(default_factory=LineTail)
    _fd: int | None = field(default=None, repr=False)
    _buf: bytes = field(default=b"", repr=False)


class _Console:
    """One console stream of the tee: its fd (found once), whether a write must stay within
    ``PIPE_BUF`` to be atomic (a pipe or socket), and whether it still works."""

    def __init__(self, dst: TextIO) -> None:
        self.dst = dst
        self.ok = True
        self.fd: int | None = None
        self.limit = 0  # 0: one write for everything
        try:
            self.fd = dst.fileno()
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: an in-memory stream
            return
        try:
            mode = os.fstat(self.fd).st_mode
        except OSError:
            mode = stat.S_IFIFO
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            self.limit = _PIPE_BUF

    def write(self, data: bytes) -> None:
        """Write whole lines straight to the fd, to a pipe in pieces of at most ``PIPE_BUF``
        bytes: such a write is atomic, so a log record another thread writes to stderr
        (often the same pipe) lands between two lines, never inside one."""
        if not self.ok:
            return
        try:
            if self.fd is None:
                self.dst.write(data.decode("utf-8", "replace"))
                self.dst.flush()
                return
            self.dst.flush()  # what others wrote through the stream goes first
            if not self.limit or len(data) <= self.limit:
                _write_all(self.fd, data)
                return
            start, end_of_data = 0, len(data)
            while start < end_of_data:
                end = start + self.limit
                if end >= end_of_data:
                    end = end_of_data
                else:
                    cut = data.rfind(b"\n", start, end)
                    # a line longer than PIPE_BUF goes whole
                    end = cut + 1 if cut >= start else (data.find(b"\n", end) + 1 or end_of_data)
                _write_all(self.fd, data[start:end])
                start = end
        except (BrokenPipeError, ValueError, OSError):
            self.ok = False  # console gone: the files still hold everything


def _cap(line: bytes) -> bytes:
    return line if len(line) <= MAX_TAIL_LINE_BYTES else line[:MAX_TAIL_LINE_BYTES] + _CUT


def _last_segment(line: bytes) -> bytes:
    """What a terminal shows of a line a progress bar rewrote with ``\\r``."""
    return next((seg for seg in reversed(line.split(b"\r")) if seg), b"")


class LogTee:
    """Copies rank streams to ``dst`` line by line with a prefix, from one thread.

    Complete lines only (a partial line waits for its newline, so two writes of one
    ``print`` never come out as two prefixed pieces); at :meth:`stop` everything left is
    drained, so no line is lost. Lines that match ``filters`` are also appended to
    ``filter_file`` (torchrun's ``--duplicate-stdout-filters``). Console bytes that are not
    UTF-8 are replaced (U+FFFD); the log files get the bytes as written.

    Args:
        sources: the streams, in console order within a pass.
        dst: the console (default ``sys.stdout``).
        err_dst: the console for ``to_stderr`` sources (default ``dst``, else ``sys.stderr``).
        interval: how often log files (sources without a pipe) are read.
        filters: substrings of the lines also copied to ``filter_file``.
        filter_file: where those lines go.
        on_warning: called once per problem (``log truncated: ...``).

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
        out = dst if dst is not None else sys.stdout
        err = err_dst if err_dst is not None else (dst if dst is not None else sys.stderr)
        self._out = _Console(out)
        self._err = self._out if err is out else _Console(err)
        self._prefixes = [src.prefix.encode("utf-8", "replace") for src in sources]
        self._interval = interval
        self._filters = filters or []
        self._filter_file = filter_file if self._filters else None
        self._filtered: LossyFile | None = None
        self._warn = on_warning or (lambda _text: None)
        self._warned: set[str] = set()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None

    def start(self) -> LogTee:
        """Start copying in a daemon thread.

        Returns:
            this tee.
        """
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

    def _run(self) -> None:
        poll = select.poll()  # the sources are fixed: registered once
        poll.register(self._wake_r, select.POLLIN)
        for src in self._sources:
            if src.pipe is not None:
                poll.register(src.pipe.read_fd, select.POLLIN)
        files = any(src.pipe is None for src in self._sources)
        timeout_ms = 1000 * (self._interval if files else 1.0)
        try:
            most = 0
            while not self._stop.is_set():
                if 0 < most < _BATCH_BYTES and not files:  # a trickle: let the next lines gather
                    time.sleep(_BATCH_S)  # (cheaper than an Event's timed wait; stop waits for it)
                try:
                    poll.poll(timeout_ms)
                except OSError:
                    time.sleep(self._interval)
                most = self._pump_safely()
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

    def _pump_safely(self, *, final: bool = False) -> int:
        """:meth:`_pump`, never raising: a worker blocks on a full pipe if the tee stops reading."""
        try:
            return self._pump(final=final)
        except Exception as e:  # a bug here must not hang the workers
            self._warn_once(f"the console copy of the rank logs failed: {type(e).__name__}: {e}")
            return 0

    def _read(self, src: TeeSource) -> bytes:
        """What ``src`` holds now (a bounded amount: one chatty rank cannot starve the
        others). A pipe's bytes go to its log file first (truncated, with a warning, once
        it fails)."""
        if src.pipe is not None:
            fd = src.pipe.read_fd
        else:
            if src._fd is None:
                try:  # the worker owns this file: a FIFO or a symlink put there must not block or lead us
                    src._fd = os.open(src.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
                except FileNotFoundError:
                    return b""
                except OSError as e:
                    self._warn_once(f"log not copied to the console: {src.path}: {e.strerror or e}")
                    src.echo, src.path = False, os.devnull
                    return b""
            fd = src._fd
        chunks: list[bytes] = []
        for _ in range(_READS):
            try:
                chunk = os.read(fd, _READ)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if len(chunk) < _READ and src.pipe is not None:
                break  # the pipe is empty now: spare the read that would fail
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if data and src.pipe is not None and not src.pipe.sink.write(data):
            self._warn_once(src.pipe.sink.lost)
        return data

    def _pump(self, *, final: bool) -> int:
        """Copy what the streams hold now (a bounded amount per stream).

        Returns:
            the most bytes one stream gave (0: nothing was read).
        """
        most = 0
        out: list[bytes] = []
        err: list[bytes] = []
        filtered: list[str] = []
        for src, prefix in zip(self._sources, self._prefixes, strict=True):
            data = self._read(src)
            if len(data) > most:
                most = len(data)
            if src._buf:
                data = src._buf + data
            cut = data.rfind(b"\n") + 1
            body, rest = data[:cut], data[cut:]
            open_end = False
            if rest and (final or len(rest) > _MAX_PARTIAL):
                body, rest, open_end = body + rest + b"\n", b"", not final
            src._buf = rest
            if not body:
                continue
            if b"\r" in body:  # progress bars rewrite a line with \r: show what a terminal would show
                body = b"\n".join([_last_segment(line) if b"\r" in line else line for line in body.split(b"\n")])
            if not body.isascii():  # the console gets UTF-8: invalid bytes become U+FFFD, as text would
                body = body.decode("utf-8", "replace").encode("utf-8")
            # past the rank's own log, a worker's ESC, BEL, NUL... are shown, never obeyed
            body = escape_control_bytes(body)
            text = body[:-1]  # the lines, joined by newlines
            lines = text.rsplit(b"\n", TAIL_LINES)
            whole = len(lines) <= TAIL_LINES
            src.tail.extend(lines if whole else lines[-TAIL_LINES:], whole=whole, open_end=open_end)
            if src.echo:
                (err if src.to_stderr else out).append(
                    prefix + text.replace(b"\n", b"\n" + prefix) + b"\n" if prefix else body
                )
            if self._filter_file:
                needles = self._filters
                filtered.extend(
                    f"{src.prefix}{line}\n"
                    for line in text.decode("utf-8", "replace").split("\n")
                    if any(needle in line for needle in needles)
                )
        if out:
            self._out.write(out[0] if len(out) == 1 else b"".join(out))
        if err:
            self._err.write(err[0] if len(err) == 1 else b"".join(err))
        if filtered and self._filter_file:
            if self._filtered is None:
                self._filtered = LossyFile(self._filter_file)
            if not self._filtered.write("".join(filtered).encode("utf-8", "replace")):
                self._warn_once(self._filtered.lost)
                self._filter_file = None
        return most


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
