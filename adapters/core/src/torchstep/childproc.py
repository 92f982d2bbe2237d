"""Helper children that serve until their stdin closes (the agent's reaper, the local
launcher's rendezvous store): one way to end them."""

from __future__ import annotations

import subprocess


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
