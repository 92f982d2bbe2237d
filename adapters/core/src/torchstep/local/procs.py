"""Process plumbing of the local supervisor: how an agent is started, and how every process
of a run is found and killed — including workers orphaned by an agent that was SIGKILLed.

Every process the supervisor starts carries ``TORCHSTEP_LAUNCH_TOKEN=<run token>/<replica
token>`` in its environment, and every descendant inherits it (the agent passes its
environment to its workers, ``bash -c`` does too). ``/proc/<pid>/environ`` holds the
environment a process was started with, so a scan finds every survivor whatever process
group, session or parent it ended up in.

Example::

    >>> from torchstep.local.procs import tagged_pids
    >>> tagged_pids("no-such-run/")
    []
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from torchstep.contract import ENV_LAUNCH_TOKEN

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
