"""Per-rank log files that are never deleted, and the pipes the tee
(:mod:`torchstep.agent.tee`) copies into them and onto the agent's stdout with a
``[role/rank]`` prefix.

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
agent's private run directory that torch opens like a file — and the tee copies
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

import fcntl
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from string import Template

from torch.distributed.elastic.multiprocessing.api import LogsDest, LogsSpecs

from torchstep.agent import compat
from torchstep.contract import ENV_ERROR_FILE as ERROR_FILE_ENV
from torchstep.files import DIR_MODE, LossyFile, UnsafePathError, open_private, private_dir, private_root

#: Called with one line (``log truncated: <path>: <reason>``) when a log cannot be written.
WarningCallback = Callable[[str], None]
#: Capacity asked for each worker's pipe (the kernel may give less): a chatty worker runs
#: ahead of the tee by this much before a write of its waits.
_PIPE_SIZE = 1 << 20

#: ``[role/rank] `` — the default prefix of a rank's line on the agent's stdout.
DEFAULT_PREFIX_TEMPLATE = "[${role_name}/${rank}] "


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
    :class:`torchstep.agent.tee.LogTee`, so no torch tee is configured.

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
        #: streams): the agent hands them to its :class:`~torchstep.agent.tee.LogTee`.
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
        dest = compat.logs_dest(filtered_stdout=os.devnull, filtered_stderr=os.devnull)
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
    """The last ``n`` lines of a file (reads at most ``max_bytes`` from its end); nothing
    when it is not a regular file (a FIFO a worker put there is never waited on) or a symlink.

    Example::

        >>> import tempfile
        >>> f = tempfile.NamedTemporaryFile("w", delete=False); _ = f.write("a\\nb\\nc\\n"); f.close()
        >>> tail_lines(f.name, 2)
        ['b', 'c']
    """
    try:  # the worker owns this file: a FIFO or a symlink put there must not block or lead us
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return []
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one is cut
    return lines[-n:] if n > 0 else []
