"""Network helpers shared by the test suites (on ``sys.path`` through pytest's ``pythonpath``)."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_range() -> tuple[int, int]:
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A free loopback TCP port for a server a test starts later, outside the ephemeral range.

    ``bind(("127.0.0.1", 0))`` hands out an *ephemeral* port; between that check and the server's
    own bind, any outgoing connection (psycopg to PostgreSQL during ``airflow db migrate``, HTTP
    polling) may get the same port as its source port, and the server then dies with EADDRINUSE
    (this failed a CI run). The kernel never uses ports below the ephemeral range as source ports,
    so a port picked there stays free unless another server takes it.
    """
    lo, _ = _ephemeral_range()
    candidates = list(range(max(1024, lo - 12000), lo))
    random.shuffle(candidates)
    for port in candidates[:500]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port below the ephemeral range ({lo})")
