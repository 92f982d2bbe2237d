"""The product's one process-tree module: process groups, exact exit times, the reaper that
kills every worker group when the agent itself dies (the agent's), and how the local
supervisor starts an agent and finds every process of a run, including workers orphaned by
an agent that was SIGKILLed.

Every process the local supervisor starts carries ``TORCHSTEP_LAUNCH_TOKEN=<run token>/<replica
token>`` in its environment, and every descendant inherits it (the agent passes its
environment to its workers, ``bash -c`` does too). ``/proc/<pid>/environ`` holds the
environment a process was started with, so a scan (:func:`tagged_pids`) finds every survivor
whatever process group, session or parent it ended up in.

No torch here (the agent runs it in the user's image). Linux semantics (``/proc``,
``waitid``, sessions); elsewhere the helpers degrade to ``kill(pid, 0)``.

Example::

    >>> import os
    >>> from torchstep.agent.procs import pid_alive, tagged_pids
    >>> pid_alive(os.getpid()), tagged_pids("no-such-run/")
    (True, [])
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torchstep.childproc import close_stdin_and_wait
from torchstep.contract import ENV_LAUNCH_TOKEN

log = logging.getLogger("torchstep.agent")

_REAPER = str(Path(__file__).with_name("_reaper.py"))
EXEC_WRAPPER = str(Path(__file__).with_name("_exec.py"))


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # the command name is in parentheses and may contain spaces: split after the last ')'
    return raw[raw.rfind(")") + 2 :].split()


def _proc_stats() -> list[tuple[int, list[str]]]:
    """``(pid, stat fields after the command name)`` of every process in ``/proc``."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    stats = ((int(name), _stat_fields(int(name))) for name in names if name.isdigit())
    return [(pid, fields) for pid, fields in stats if fields is not None]


def pid_alive(pid: int) -> bool:
    """``True`` if ``pid`` exists and is not a zombie.

    Example::

        >>> pid_alive(2**22 + 1)
        False
    """
    fields = _stat_fields(pid)
    if fields is not None:
        return fields[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.isdir("/proc")  # /proc exists but has no entry: gone


def exited_now(pid: int) -> bool:
    """``True`` if our child ``pid`` has exited (reaped or not); never reaps it.

    Example: ``exited_now(proc.pid)`` right after ``proc.kill(); time.sleep(0.1)`` is ``True``.
    """
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped by its owner
        return True
    except OSError:
        return not pid_alive(pid)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``.

    Example::

        >>> os.getpid() in group_members(os.getpgid(0))
        True
    """
    return [
        pid
        for pid, fields in _proc_stats()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X")
    ]


def signal_group(pgid: int, sig: int) -> bool:
    """``killpg`` that ignores a vanished group; never signals our own group.

    Example::

        >>> signal_group(os.getpgid(0), signal.SIGTERM)
        False
    """
    if pgid <= 1 or pgid == os.getpgid(0):
        return False
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_groups(pgids: list[int], *, wait_s: float = 2.0) -> list[int]:
    """SIGKILL whole process groups (a worker and e.g. its dataloader children) and wait
    until they are gone; returns the pids still alive after ``wait_s`` (D-state).

    Example: ``kill_groups([worker.pid])`` after the worker leader exited kills its children.
    """
    for pgid in pgids:
        signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    left: list[int] = []
    while True:
        left = [pid for pgid in pgids for pid in group_members(pgid)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


@dataclass
class ExitInfo:
    """When and how a child process ended (seen by ``waitid`` the moment it exits).

    Example: ``ExitInfo(time=1795257685.39, exit_code=-9)`` — killed by SIGKILL.
    """

    time: float
    exit_code: int  # like Popen.returncode: -N when killed by signal N


class ExitWatcher:
    """Records the exact exit time of child processes without reaping them.

    torch's process context polls every ``--monitor-interval``; a thread blocked in
    ``waitid(WNOWAIT)`` learns the moment a worker dies, which orders failures correctly
    (the root cause is the rank that died first, not the first one noticed).

    Example::

        >>> import subprocess
        >>> w = ExitWatcher()
        >>> p = subprocess.Popen(["sleep", "0.2"]); w.watch(p.pid)
        >>> w.wait_for(p.pid, 5).exit_code, p.wait()
        (0, 0)
    """

    def __init__(self) -> None:
        self._exits: dict[int, ExitInfo] = {}
        self._watched: set[int] = set()
        self._starting = 0
        self._cond = threading.Condition()

    def watched(self, pid: int) -> bool:
        """Whether ``pid`` is one of ours (a worker), as opposed to an adopted orphan."""
        with self._cond:
            return pid in self._watched

    @contextlib.contextmanager
    def starting(self) -> Iterator[None]:
        """Workers are being started and not all of them watched yet: meanwhile no child is
        taken for an adopted orphan (:meth:`busy`)."""
        with self._cond:
            self._starting += 1
        try:
            yield
        finally:
            with self._cond:
                self._starting -= 1

    def busy(self) -> bool:
        """Whether workers are being started right now (see :meth:`starting`)."""
        with self._cond:
            return self._starting > 0

    def watch(self, pid: int) -> None:
        with self._cond:
            self._watched.add(pid)
        threading.Thread(target=self._wait, args=(pid,), name=f"torchstep-exit-{pid}", daemon=True).start()

    def _wait(self, pid: int) -> None:
        code: int | None = None
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            if info is not None:
                code = -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status
        except ChildProcessError:  # already reaped by its owner: the time is still close
            pass
        except OSError:
            return
        with self._cond:
            self._exits[pid] = ExitInfo(time.time(), code if code is not None else -1)
            self._cond.notify_all()

    def get(self, pid: int) -> ExitInfo | None:
        with self._cond:
            return self._exits.get(pid)

    def wait_for(self, pid: int, timeout: float) -> ExitInfo | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits, timeout)
            return self._exits.get(pid)


_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (``PR_SET_CHILD_SUBREAPER``):
    a worker's double-forked daemon is re-parented here, not to init, so it can be found
    and killed. False where unsupported."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    """The live and zombie children of ``pid`` (from ``/proc``).

    Args:
        pid: the parent.

    Returns:
        the children's pids.
    """
    found = _task_children(pid)
    if found is not None:
        return found
    return [child for child, fields in _proc_stats() if len(fields) > 1 and fields[1] == str(pid)]


_HAS_TASK_CHILDREN: bool | None = None  # whether the kernel has /proc/<pid>/task/<tid>/children


def _task_children(pid: int) -> list[int] | None:
    """The children of ``pid`` from its threads' ``children`` files: one read per thread of
    ``pid`` instead of one per process on the machine (the orphan sweep runs twice a
    second). ``None`` where the kernel has no such files (``CONFIG_PROC_CHILDREN``)."""
    global _HAS_TASK_CHILDREN
    if _HAS_TASK_CHILDREN is None:
        _HAS_TASK_CHILDREN = os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")
    if not _HAS_TASK_CHILDREN:
        return None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # no such process: no children
    found: list[int] = []
    for tid in tids:  # a child belongs to the thread that forked it (or adopted it)
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(child) for child in f.read().split())
        except OSError:  # the thread ended: its children moved to another one
            pass
    return found


class OrphanSweeper:
    """Finds the descendants the agent adopted (a worker's ``setsid``/double-forked daemon,
    re-parented here because the agent is a subreaper), registers each with the reaper
    as it appears (so even a SIGKILLed agent takes them along) and kills them at the end.

    An adopted process stays our child until we reap it, so its pid is never reused while
    it is registered.

    Example::

        sweeper = OrphanSweeper(reaper, exits)   # exits: the ExitWatcher of the workers
        sweeper.start()
        ...
        sweeper.kill_all()
    """

    def __init__(self, reaper: Reaper, exits: ExitWatcher, *, interval: float = 0.5) -> None:
        self._reaper = reaper
        self._exits = exits
        self._interval = interval
        self._seen: dict[int, bool] = {}  # pid -> killed as a group (it leads its own)
        self._helpers: set[int] = set()  # the agent's own children (the worker zygote)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def helper(self, pid: int) -> None:
        """``pid`` is a child the agent started itself (the worker zygote): not an orphan."""
        with self._lock:
            self._helpers.add(pid)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="torchstep-orphans", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sweep()

    def sweep(self) -> list[int]:
        """Register the adopted children not seen before; returns them."""
        new: list[int] = []
        if self._exits.busy():  # a worker just forked and not watched yet is no orphan
            return new
        me = os.getpid()
        with self._lock:
            for pid in children_of(me):
                if pid in self._seen or pid in self._helpers or pid == self._reaper.pid or self._exits.watched(pid):
                    continue
                fields = _stat_fields(pid)
                if fields is None or fields[0] in ("Z", "X"):
                    continue
                own_group = fields[2] == str(pid)
                self._seen[pid] = own_group
                if own_group:
                    self._reaper.watch_group(pid)
                else:
                    self._reaper.watch_pid(pid)
                new.append(pid)
        if new:
            log.warning(
                "adopted %d orphaned process(es) of the workers %s; they are killed when the run ends", len(new), new
            )
        return new

    def kill_all(self) -> int:
        """Stop sweeping, kill every adopted process (and its group) and reap it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.sweep()
        with self._lock:
            seen = dict(self._seen)
        for pid, own_group in seen.items():
            try:
                if own_group:
                    os.killpg(pid, signal.SIGKILL)
                else:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 2.0
        for pid in seen:
            while True:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    break
                if done or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        return len(seen)


class Reaper:
    """Client side of ``_reaper.py``: a process in its own session that outlives the agent.

    Example::

        reaper = Reaper(results=["/tmp/result.json"], run_dir="/tmp/run")
        reaper.start()
        reaper.watch_group(worker_pid)     # workers are group leaders (own session)
        ...
        reaper.finish()                    # normal end: "done", then EOF
    """

    def __init__(self, *, results: list[str], run_dir: str | None) -> None:
        self._results = results
        self._run_dir = run_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        argv = [sys.executable, "-I", "-S", _REAPER]
        for path in self._results:
            argv += ["--result", path]
        if self._run_dir:
            argv += ["--run-dir", self._run_dir]
        # own session: a kill of the agent's process group (or a terminal's ^C) spares it
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def _send(self, line: str) -> None:
        with self._lock:
            if self._proc is None or self._proc.stdin is None or self._proc.stdin.closed:
                return
            try:
                self._proc.stdin.write(line.encode() + b"\n")
                self._proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                log.warning("the reaper is gone; workers will not be killed if the agent dies")

    def command_fd(self) -> int | None:
        """The write end of the reaper's command pipe, for a helper (the worker zygote) that
        registers process groups itself (one short line per write: atomic on a pipe)."""
        proc = self._proc
        return proc.stdin.fileno() if proc is not None and proc.stdin is not None else None

    def watch_group(self, pgid: int) -> None:
        self._send(f"g {pgid}")

    def forget_group(self, pgid: int) -> None:
        self._send(f"ug {pgid}")

    def watch_pid(self, pid: int) -> None:
        self._send(f"p {pid}")

    def forget_pid(self, pid: int) -> None:
        self._send(f"up {pid}")

    def finish(self, timeout: float = 5.0) -> None:
        """Normal end: the reaper kills what is left (nothing, normally) and exits."""
        self._send("done")
        with self._lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            close_stdin_and_wait(proc, timeout)


# -- the local supervisor's processes ------------------------------------------------------
#: Environment variable marking every process of a local run (see module docstring).
ENV_TOKEN = ENV_LAUNCH_TOKEN
_TOKEN_PREFIX = (ENV_TOKEN + "=").encode()

# Runs between fork and the agent: ties the agent's life to the supervisor thread that started
# it (PR_SET_PDEATHSIG survives execve), then applies the CPU affinity before the agent can
# start workers (they inherit it), then execs the agent. A constant program: user data only
# travels as argv.
_EXEC_SHIM = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os._exit(70)  # the supervisor died before prctl took effect
if sys.argv[2]:
    os.sched_setaffinity(0, [int(c) for c in sys.argv[2].split(",")])
os.execvp(sys.argv[3], sys.argv[3:])
"""


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | None,
    cpus: Sequence[int] = (),
    stdin: int | None = subprocess.DEVNULL,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (the supervisor alone decides when it stops), with
    its stdout and stderr merged into one pipe, dying with the calling thread's process.

    Args:
        argv: the command.
        env: its complete environment.
        cwd: its working directory; ``None``: the caller's.
        cpus: cores to pin it to (empty: not pinned).
        stdin: its stdin (``subprocess.DEVNULL`` by default; ``subprocess.PIPE`` to hold it).
        pass_fds: file descriptors it inherits (listening sockets).

    Returns:
        The process, its output in ``stdout``.

    Raises:
        OSError: the command cannot be started.
    """
    shim = [sys.executable, "-S", "-c", _EXEC_SHIM, str(os.getpid()), ",".join(map(str, cpus))]
    return subprocess.Popen(
        [*shim, *argv],
        env=dict(env),
        cwd=cwd,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        close_fds=True,
        pass_fds=tuple(pass_fds),
    )


def tagged_pids(*prefixes: str) -> list[int]:
    """Live processes whose launch token starts with one of ``prefixes`` (this process excluded).

    Args:
        *prefixes: launch token prefixes (a run's token).

    Returns:
        Their pids.
    """
    want = tuple(_TOKEN_PREFIX + p.encode() for p in prefixes)
    me = os.getpid()
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: nothing we can find
        return []
    for name in entries:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                data = f.read()
        except OSError:  # gone, or not ours
            continue
        if any(item.startswith(want) for item in data.split(b"\0")):
            found.append(int(name))
    return found


def kill_tagged(prefix: str, *, rounds: int = 20) -> int:
    """SIGKILL every process tagged with ``prefix`` until none is left (a process may start
    a child while we sweep).

    Args:
        prefix: the launch token prefix.
        rounds: the most sweeps.

    Returns:
        How many processes were killed.
    """
    killed = 0
    for _ in range(rounds):
        pids = tagged_pids(prefix)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.02)
    return killed
