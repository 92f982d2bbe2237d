"""Helper children that serve until their stdin closes (the agent's reaper, the local
launcher's rendezvous store): one way to end them; and a step process that ends when the
processes that started it die or stop reading its output (:func:`stop_when_ancestors_die`)."""

from __future__ import annotations

import os
import select
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable


def close_stdin_and_wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Close ``proc``'s stdin (its signal to finish), wait up to ``timeout`` s, then kill it.

    Example::

        >>> import sys
        >>> p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        >>> close_stdin_and_wait(p, 10); p.returncode
        0
    """
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


#: Set once this process is stopping on a signal (:func:`torchstep.steps.stop_on_signals` sets
#: it on the first one). The ancestors watch then sends no SIGTERM of its own: a step takes a
#: second signal for "kill every process at once", so a Ctrl-C that also ends the runner
#: (kfp.local's pipeline process and its ``sh``) would end the step 137, not a graceful 143.
STOPPING = threading.Event()
#: How long the ancestors watch lets a signal that arrived with the ancestors' end reach the
#: main thread's handler before it sends its own SIGTERM (a loaded machine runs it late).
SIGNAL_SETTLE_S = 2.0


def stop_when_ancestors_die(
    *, name: str = "torchstep-ancestors-watch", poll_s: float = 0.5, output: int | None = None
) -> None:
    """Stop this process (SIGTERM to itself: a step stops every process of it within its
    grace period) when its parent or grandparent dies — or, with ``output``, when nobody
    reads the pipe on that file descriptor any more — unless a signal has already begun
    the stop (:data:`STOPPING`, awaited :data:`SIGNAL_SETTLE_S`). For a step started as ``parent → sh
    → python`` by a runner that does not stop it when the runner itself is killed or
    interrupted (kfp.local's pipeline process: interrupted, it stops reading the step's
    output and may live on); Linux only (``/proc``).

    Args:
        name: the name of the watching (daemon) thread.
        poll_s: seconds between two looks.
        output: a file descriptor this process writes its output to; when it is a pipe whose
            read end was closed (the runner stopped reading), the step stops.
    """

    def stat_of(pid: int) -> list[bytes]:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return []

    def parent_of(pid: int) -> int:
        fields = stat_of(pid)
        return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0

    def dead(pid: int) -> bool:
        # a killed process stays in /proc as a zombie until its own parent reaps it (a
        # program that started the pipeline with Popen and waits on something else): dead
        fields = stat_of(pid)
        return not fields or fields[0] in (b"Z", b"X")

    parent = os.getppid()
    watched = [p for p in (parent, parent_of(parent)) if p > 1]
    reader_gone = _reader_gone(output) if output is not None else None

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            unread = reader_gone is not None and reader_gone()
            if unread and output is not None:
                discard_output(output)  # its last messages go nowhere: it exits as cancelled, not of EPIPE
            if unread or os.getppid() != parent or any(dead(p) for p in watched):
                # the same Ctrl-C may be on its way to this process: its handler stops the step
                if not STOPPING.wait(SIGNAL_SETTLE_S):
                    os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name=name, daemon=True).start()


def _reader_gone(fd: int) -> Callable[[], bool] | None:
    """For a pipe on ``fd``: whether its read end is closed (``poll`` reports POLLERR on a
    pipe's write end without readers, and nothing while the reader is only slow); None when
    ``fd`` is not a pipe (a terminal, a file, a container runtime's log: nothing to watch)."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
    except OSError:
        return None
    poller = select.poll()
    # a private copy of the write end: still the pipe after discard_output points fd elsewhere
    poller.register(os.dup(fd), 0)  # no event asked: POLLERR and POLLHUP are reported all the same

    def gone() -> bool:
        return any(ev & (select.POLLERR | select.POLLNVAL) for _, ev in poller.poll(0))

    return gone


def discard_output(fd: int = 1) -> None:
    """Point ``fd``, and stdout and stderr where they are the same pipe, at ``/dev/null``:
    for a process whose output nobody reads any more (the runner stopped reading), so that
    its last messages and the interpreter's final flush neither fail with EPIPE nor change
    its exit status (its rank logs and result keep everything).

    Args:
        fd: the file descriptor whose reader is gone.
    """
    try:
        gone = os.fstat(fd)
    except OSError:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for target in {fd, 1, 2}:
            try:
                st = os.fstat(target)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (gone.st_dev, gone.st_ino):
                os.dup2(null, target)
    finally:
        os.close(null)
