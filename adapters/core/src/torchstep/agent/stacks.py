"""Where every rank was when the agent stopped the group: its Python stacks, all threads.

Every stop that is not the workers' own exit (a cancel or an orchestrator's timeout: a
signal to the agent; a timer; ``--heartbeat-timeout``; ``--hang-timeout``; the watchdog)
first calls :func:`collect`: each live worker whose stacks file says its handler is
installed (``torchstep.worker.install_stack_dump``: the zygote installs it in every worker
it forks) gets :data:`~torchstep.contract.STACKS_SIGNAL`; ``faulthandler`` writes all its
threads' stacks to that file from a C signal handler, so a rank inside a collective or any
native call answers too. A Python worker the agent exec'd gets the same handler from the
exec wrapper's ``sitecustomize`` (``torchstep.agent._exec.site_env``), whether or not its
script imports torchstep. The whole group gets at most ``timeout`` seconds (2 s); a rank
that does not answer (the signal blocked, the process stopped) or has no handler (not a
Python process; ``python -I``/``-E``/``-S``) gets a line saying so
(:func:`no_handler_reason`).

Each dump is parsed (:func:`parse_dump`): the main thread's innermost frames, the innermost
frame of the user's code, and the ``torch.distributed`` call it is in, if any.
:func:`summary` names the outlier: ``rank 3 at train.py:42 in load_batch; ranks 0-2
waiting in all_reduce``.

Example::

    stacks = collect([StackTarget(rank=0, pid=1234, path="/run/attempt_0/stacks.0")])
    summary(stacks)     # 'rank 0 at train.py:42 in load_batch'
"""

from __future__ import annotations

import contextlib
import os
import re
import sysconfig
import time
from dataclasses import dataclass, field

from torchstep.contract import STACKS_SIGNAL
from torchstep.result import summarize_where

#: The whole group's bound for :func:`collect` (issue 37: <= 2 s).
COLLECT_TIMEOUT_S = 2.0
#: Frames of the main thread kept in the result (the file has them all).
RESULT_FRAMES = 6
#: The most bytes read of one rank's dump (hundreds of threads stay readable in the file).
MAX_DUMP_BYTES = 256 * 1024

_HEADER = re.compile(r"^torchstep stacks of pid (\d+)$")
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')
_LIBRARY_DIRS = tuple(
    os.path.realpath(p) + os.sep
    for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)
_TORCHSTEP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@dataclass
class StackTarget:
    """One worker to ask: its global rank, the pid the agent started (the exec wrapper of a
    zygote-forked worker) and its stacks file.

    Example: ``StackTarget(rank=3, pid=4242, path="/run/attempt_0/stacks.3")``.
    """

    rank: int
    pid: int
    path: str


@dataclass
class Frame:
    """One Python frame of a dump.

    Example: ``Frame("/src/train.py", 42, "load_batch").short()`` is ``"train.py:42 in load_batch"``.
    """

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    def short(self) -> str:
        """The frame with the file's base name."""
        return f"{os.path.basename(self.file)}:{self.line} in {self.function}"


@dataclass
class RankStack:
    """What :func:`collect` found for one rank.

    ``frames``: the main thread's frames, innermost first; ``where``: the innermost frame of
    the user's code (short form) or, without a dump, why there is none; ``waiting_in``: the
    ``torch.distributed`` call it was in; ``text``: the whole dump (all threads).

    Example: ``RankStack(3, where="train.py:42 in load_batch").line()`` is ``"at train.py:42 in load_batch"``.
    """

    rank: int
    pid: int | None = None
    frames: list[Frame] = field(default_factory=list)
    where: str = ""
    waiting_in: str | None = None
    text: str = ""
    ok: bool = False

    def line(self) -> str:
        """How :func:`summary` describes this rank (after ``rank N``)."""
        if not self.ok:
            return f"gave no stack: {self.where}"
        if self.waiting_in:
            return f"waiting in {self.waiting_in}"
        return f"at {self.where}"

    def result_lines(self) -> list[str]:
        """The short form the step result keeps (``RankResult.stack``)."""
        if not self.ok:
            return [f"no stack: {self.where}"]  # e.g. "no stack: it had exited"
        return [str(f) for f in self.frames[:RESULT_FRAMES]]


def _is_library(path: str) -> bool:
    if path.startswith("<"):  # <frozen runpy>, <string>
        return True
    real = os.path.realpath(path)
    if real.startswith(_TORCHSTEP_DIR) or "/site-packages/" in real or "/dist-packages/" in real:
        return True
    return real.startswith(_LIBRARY_DIRS)


def _collective(frames: list[Frame]) -> str | None:
    """The outermost public ``torch.distributed`` function among ``frames`` (innermost first):
    ``all_reduce`` for ``all_reduce -> wrapper (c10d_logger) -> ...``."""
    name = None
    for f in frames:
        path = f.file.replace(os.sep, "/")
        if "/torch/distributed/" in path and "/torch/distributed/elastic/" not in path:
            if not f.function.startswith(("_", "<")) and f.function not in ("wrapper", "inner"):
                name = f.function
    return name


def parse_dump(text: str) -> tuple[list[Frame], str, str | None]:
    """The main thread's frames (innermost first), the innermost frame of the user's code
    (short form), and the ``torch.distributed`` call it is in, from one ``faulthandler`` dump.

    The main thread is the one whose stack holds a ``<module>`` frame (the script), else
    the thread that ran the handler ("Current thread"), else the first.

    Args:
        text: the dump (``faulthandler``'s format, all threads).

    Returns:
        ``(frames, where, waiting_in)``; ``where`` is ``"no Python frame"`` when the dump
        has none.

    >>> dump = ('Current thread 0x00007f (most recent call first):\\n'
    ...         '  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2 in all_reduce\\n'
    ...         '  File "/src/train.py", line 9 in step\\n  File "/src/train.py", line 20 in <module>\\n')
    >>> frames, where, waiting = parse_dump(dump)
    >>> (where, waiting, len(frames))
    ('train.py:9 in step', 'all_reduce', 3)
    """
    threads: list[tuple[bool, list[Frame]]] = []
    for raw in text.splitlines():
        m = _THREAD.match(raw)
        if m:
            threads.append((m.group(1) == "Current thread", []))
            continue
        f = _FRAME.match(raw)
        if f and threads:
            threads[-1][1].append(Frame(f.group(1), int(f.group(2)), f.group(3)))
    if not threads:
        return [], "no Python frame", None
    main = next((fr for _, fr in threads if any(x.function == "<module>" for x in fr)), None)
    if main is None:
        main = next((fr for cur, fr in threads if cur), threads[0][1])
    if not main:
        return [], "no Python frame", None
    user = next((f for f in main if not _is_library(f.file)), main[0])
    return main, user.short(), _collective(main)


def _header_pid(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        first = os.read(fd, 128).split(b"\n", 1)[0].decode("ascii", "replace")
    finally:
        os.close(fd)
    m = _HEADER.match(first)
    return int(m.group(1)) if m else None


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _read_from(path: str, offset: int) -> str:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            data = os.read(fd, MAX_DUMP_BYTES)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace")
    return ""


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def no_handler_reason(pid: int) -> str:
    """Why worker ``pid`` has no stack handler, from its command line: not a Python process
    (a shell script, a binary), or a Python that skips ``PYTHONPATH`` or ``site``, where the
    exec'd worker's handler comes from (``-I``, ``-E``, ``-S``).

    Args:
        pid: the process the agent started for the rank.

    Returns:
        The line the rank gets (``RankStack.where``), e.g. ``"no Python stack: the worker is
        not a Python process (bash run.sh)"``.
    """
    from torchstep.agent._exec import python_flags

    argv = _cmdline(pid)
    if "--" in argv and any(os.path.basename(a) == "_exec.py" for a in argv[: argv.index("--")]):
        argv = argv[argv.index("--") + 1 :]  # still the exec wrapper (or the zygote's): its command
    else:
        with contextlib.suppress(OSError):
            exe = os.readlink(f"/proc/{pid}/exe")
            if argv and os.path.basename(exe).startswith("python"):
                argv = [exe, *argv[1:]]  # the interpreter itself, whatever argv[0] says
    if not argv:
        return "no stack handler (its command line cannot be read)"
    flags = python_flags(argv)
    if flags is None:
        what = " ".join(os.path.basename(a) for a in argv[:2])
        return f"no Python stack: the worker is not a Python process ({what})"
    if flags:
        return (
            f"no stack handler: the worker runs with {'/'.join(flags)} (its Python skips PYTHONPATH or site, "
            "where torchstep's handler comes from)"
        )
    return "no stack handler (none installed yet: the worker was still starting, or could not create its stacks file)"


def collect(targets: list[StackTarget], *, timeout: float = COLLECT_TIMEOUT_S) -> dict[int, RankStack]:
    """Ask every target for its stacks at once and wait at most ``timeout`` s for all.

    A target is signalled only when its stacks file's first line names its pid, or the pid
    of a worker the zygote forked for it (the default action of the signal would kill a
    process without the handler).

    Args:
        targets: the workers (see :class:`StackTarget`).
        timeout: the bound for the whole group.

    Returns:
        Global rank -> :class:`RankStack`, one per target (with or without a dump).
    """
    from torchstep.agent.zygote_handle import wrapper_of

    deadline = time.monotonic() + timeout  # the whole group's, signalling included
    out: dict[int, RankStack] = {}
    waiting: dict[int, tuple[StackTarget, int]] = {}  # rank -> (target, size before)
    for t in targets:
        st = out[t.rank] = RankStack(t.rank, pid=t.pid)
        worker = _header_pid(t.path)
        if worker is None or (worker != t.pid and wrapper_of(worker) != t.pid):
            st.where = no_handler_reason(t.pid)
            continue
        st.pid = worker
        if not _alive(worker):
            st.where = "it had exited"
            continue
        before = _size(t.path)
        try:
            os.kill(worker, STACKS_SIGNAL)
        except OSError as e:
            st.where = f"cannot signal pid {worker}: {e.strerror}"
            continue
        waiting[t.rank] = (t, before)
    last: dict[int, int] = {}
    steady: dict[int, int] = {}
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        for rank, (t, before) in list(waiting.items()):
            size = _size(t.path)
            if size <= before:
                continue
            # faulthandler writes the dump in one go without an end marker: done once the
            # size stops growing (two polls)
            steady[rank] = steady.get(rank, 0) + 1 if last.get(rank) == size else 0
            last[rank] = size
            if steady[rank] >= 2:
                _parsed(out[rank], _read_from(t.path, before))
                del waiting[rank]
    for rank, (t, before) in waiting.items():
        if _size(t.path) > before:  # still writing (hundreds of threads): what is there
            _parsed(out[rank], _read_from(t.path, before))
        else:
            why = "the signal is blocked, or the process is stopped or in the kernel"
            out[rank].where = f"no answer within {timeout:g}s ({why})"
    return out


def _parsed(st: RankStack, text: str) -> None:
    st.text = text
    st.frames, st.where, st.waiting_in = parse_dump(text)
    st.ok = bool(st.frames)


def outliers(stacks: dict[int, RankStack]) -> list[int]:
    """The ranks that hold the others up: those with a stack outside any ``torch.distributed``
    call while others wait in one; ``[]`` when that cannot be told (all in a collective, or
    none).

    >>> s = {0: RankStack(0, where="t.py:1 in f", waiting_in="all_reduce", ok=True),
    ...      1: RankStack(1, where="t.py:9 in load", ok=True)}
    >>> outliers(s)
    [1]
    """
    waiting = [r for r, s in stacks.items() if s.ok and s.waiting_in]
    others = [r for r, s in stacks.items() if s.ok and not s.waiting_in]
    return sorted(others) if waiting and others else []


def summary(stacks: dict[int, RankStack]) -> str:
    """One line: the outliers first, then the ranks grouped by where they were
    (:func:`torchstep.result.summarize_where`).

    >>> s = {r: RankStack(r, where="t.py:1 in f", waiting_in="all_reduce", ok=True) for r in range(3)}
    >>> s[3] = RankStack(3, where="train.py:42 in load_batch", ok=True)
    >>> summary(s)
    'rank 3 at train.py:42 in load_batch; ranks 0-2 waiting in all_reduce'
    """
    return summarize_where([(rank, st.line()) for rank, st in stacks.items()])


def write_file(path: str, why: str, stacks: dict[int, RankStack]) -> bool:
    """Write every rank's whole dump to ``path`` (0600, never through a symlink), under a
    header saying why they were taken and the :func:`summary`.

    Returns:
        Whether it was written.
    """
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    parts = [f"torchstep: the stacks of every rank, taken {stamp} ({why})", summary(stacks), ""]
    for rank in sorted(stacks):
        st = stacks[rank]
        parts.append(f"=== rank {rank} (pid {st.pid}): {st.line()}")
        parts.append(st.text.rstrip() if st.text else f"no stack: {st.where}")
        parts.append("")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(parts) + "\n")
        return True
    except OSError:
        return False
