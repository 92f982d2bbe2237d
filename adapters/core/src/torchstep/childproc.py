"""Helper children that serve until their stdin closes (the agent's reaper, the local
launcher's rendezvous store): one way to end them; and a step process that ends when the
processes that started it die (:func:`stop_when_ancestors_die`)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time


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


def stop_when_ancestors_die(*, name: str = "torchstep-ancestors-watch", poll_s: float = 0.5) -> None:
    """Stop this process (SIGTERM to itself: a step stops every process of it within its
    grace period) when its parent or grandparent dies. For a step started as ``parent → sh
    → python`` by a runner that does not stop it when the runner itself is killed or
    interrupted (kfp.local's pipeline process); Linux only (``/proc``).

    Args:
        name: the name of the watching (daemon) thread.
        poll_s: seconds between two looks.
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

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent or any(dead(p) for p in watched):
                os.kill(os.getpid(), signal.SIGTERM)
                return

    threading.Thread(target=watch, name=name, daemon=True).start()
