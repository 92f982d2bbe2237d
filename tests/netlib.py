"""Network helpers shared by the test suites (on ``sys.path`` through pytest's ``pythonpath``)."""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any


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


class FaultyProxy:
    """An HTTP proxy on 127.0.0.1 in front of a real API (``upstream``, ``http://host:port``)
    that makes the faults of a busy server or a flaky network happen on purpose:

    * ``busy(n, retry_after)``: the next ``n`` requests are answered ``503`` with that
      ``Retry-After`` (as Prefect's server answers while its SQLite is locked), not forwarded;
    * ``lose_answer(method, path_regex)``: the next such request the API does (answers 2xx)
      has its answer lost (the connection closed without a response); an error answer of the
      real API (its own 503 while busy) passes through and leaves the rule armed.

    ``log`` lists ``(method, path, what happened)``; ``url`` replaces the API's host and port.
    """

    def __init__(self, upstream: str) -> None:
        import http.client
        import re
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        from urllib.parse import urlsplit

        parts = urlsplit(upstream)
        self.log: list[tuple[str, str, str]] = []
        self._busy: list[str] = []
        self._lose: list[tuple[str, re.Pattern[str]]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with proxy._lock:
                    busy = proxy._busy.pop(0) if proxy._busy else None
                if busy is not None:
                    proxy.log.append((self.command, self.path, "busy"))
                    answer = b'{"detail": "database busy"}'
                    self.send_response(503)
                    self.send_header("Retry-After", busy)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                with proxy._lock:
                    lose = next((r for r in proxy._lose if r[0] == self.command and r[1].search(self.path)), None)
                    if lose is not None and 200 <= resp.status < 300:
                        proxy._lose.remove(lose)
                    else:
                        lose = None
                if lose is not None:  # done upstream; the caller never hears of it
                    proxy.log.append((self.command, self.path, f"answer {resp.status} lost"))
                    self.close_connection = True
                    return
                proxy.log.append((self.command, self.path, str(resp.status)))
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PATCH = do_PUT = do_DELETE = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}{parts.path}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def busy(self, n: int, retry_after: str = "1") -> None:
        with self._lock:
            self._busy += [retry_after] * n

    def lose_answer(self, method: str, path_regex: str) -> None:
        import re

        with self._lock:
            self._lose.append((method, re.compile(path_regex)))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def api_call(method: str, url: str, **kwargs: Any) -> Any:
    """A test's own call of a real server's API (Prefect's, Airflow's), waiting as torchstep's
    REST client does (:class:`~torchstep.schedulers.rest.RetryPolicy`): Prefect's server answers
    503 while its SQLite is busy, and 429/502 are as passing. Only those answers are retried:
    the server did not do the request."""
    import time

    import httpx
    from torchstep.schedulers.rest import RetryPolicy, retry_after

    policy = RetryPolicy()
    retry = 0
    while True:
        r = httpx.request(method, url, timeout=30, **kwargs)
        retry += 1
        busy = r.status_code in policy.statuses
        wait = policy.wait(retry, retry_after(r.headers.get("Retry-After"))) if busy else None
        if wait is None:
            return r
        time.sleep(wait)
