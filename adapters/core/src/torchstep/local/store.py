"""The rendezvous store host of a local run.

Several agents on one host cannot safely host their own c10d store: the first to bind
hosts it, and when that agent dies every other agent dies with it (the store goes down with
its host). So the supervisor hosts one ``TCPStore`` per multi-replica role in a small process
of its own and every agent joins with ``--rdzv-conf is_host=false``: any agent may die and be replaced.

There is no port race: the supervisor binds and listens on ``127.0.0.1:0`` itself and hands
the listening socket to the store process (``master_listen_fd``); agents that connect before
the store is up wait in the socket's backlog. The store process exits when its stdin (a pipe
from the supervisor) closes, so it never outlives the supervisor.

Example::

    >>> from torchstep.local.store import StoreHost
    >>> host = StoreHost(2)
    >>> len(host.ports)
    2
    >>> host.close()
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from torchstep.agent import procs
from torchstep.childproc import close_stdin_and_wait


class StoreHost:
    """Listening sockets for ``count`` stores, then (``start``) the process serving them.

    Args:
        count: how many stores (one per multi-replica role); their ports are in ``ports``.
    """

    def __init__(self, count: int) -> None:
        self._socks: list[socket.socket] = []
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            s.listen(1024)
            self._socks.append(s)
        self.ports = [s.getsockname()[1] for s in self._socks]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: Mapping[str, str]) -> None:
        """Start the process that serves the stores (it takes over the sockets).

        Args:
            env: its environment (it must import torch).
        """
        if not self._socks:
            return
        fds = [s.fileno() for s in self._socks]
        argv = [sys.executable, "-m", "torchstep.local.store", *map(str, fds)]
        self.proc = procs.spawn(argv, env=env, cwd=None, stdin=subprocess.PIPE, pass_fds=fds)
        self._close_sockets()  # the store process holds them now

    def stop(self, timeout: float = 5.0) -> None:
        """Close the sockets and stop the store process (closing its stdin).

        Args:
            timeout: seconds to wait for it before it is killed.
        """
        self._close_sockets()
        p = self.proc
        if p is None:
            return
        close_stdin_and_wait(p, timeout)
        if p.stdout is not None:
            p.stdout.close()

    close = stop

    def _close_sockets(self) -> None:
        for s in self._socks:
            s.close()
        self._socks = []


def serve(fds: Sequence[int], timeout_s: float = 3600.0) -> list[Any]:
    """Host one master ``TCPStore`` on each listening socket ``fd``.

    Args:
        fds: listening socket descriptors inherited from the supervisor.
        timeout_s: the stores' timeout in seconds.

    Returns:
        The stores (keep them alive while serving).
    """
    from torch.distributed import TCPStore

    stores = []
    for fd in fds:
        with socket.socket(fileno=os.dup(fd)) as s:
            port = s.getsockname()[1]
        timeout = datetime.timedelta(seconds=timeout_s)
        try:
            store = TCPStore("127.0.0.1", port, None, True, timeout, wait_for_workers=False, master_listen_fd=fd)
        except NotImplementedError:
            # torch < 2.11: its libuv server (the default) takes no listening socket; the legacy one does
            store = TCPStore(
                "127.0.0.1", port, None, True, timeout, wait_for_workers=False, master_listen_fd=fd, use_libuv=False
            )
        stores.append(store)
    return stores


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m torchstep.local.store FD...``: serve until stdin closes.

    Args:
        argv: the socket descriptors as text; ``None``: ``sys.argv[1:]``.
    """
    fds = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    stores = serve(fds)
    sys.stdin.buffer.read()  # EOF: the supervisor closed the pipe or died
    del stores


if __name__ == "__main__":
    main()
