"""The REST client of the ``airflow`` and ``prefect`` TorchX schedulers: JSON over HTTP to
one API with one-line :class:`~torchstep.schedulers.base.SchedulerError` messages, retrying
idempotent calls as Prefect's own client does (:class:`RetryPolicy`).

It is the standard library's ``urllib``: both orchestrators bring ``httpx``, but the client
lives in the core, whose only dependencies are TorchX and PyYAML, and a CLI making a few
calls gains nothing from a connection pool. A subclass per orchestrator names its API, the
fixes its errors give and its credentials (read with
:func:`torchstep.schedulers.base.secret`).

Example::

    >>> RetryPolicy(jitter=0).wait(3), retry_after("2")
    (8.0, 2.0)
"""

from __future__ import annotations

import http.client
import json
import random
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from torchstep import retryafter
from torchstep.schedulers.base import SchedulerError


@dataclass(frozen=True)
class RetryPolicy:
    """How :class:`RestClient` retries a call, Prefect's own client's policy
    (``prefect.client.base``): an answer of 429, 502 or 503 or a lost connection is retried
    up to ``retries`` times, waiting ``Retry-After`` when the server sends it (at least
    that long, up to ``jitter`` more) and else ``backoff_s`` doubled per retry with
    ``jitter``; a refused connection only after the server answered this client once (a
    wrong URL fails at once). Only idempotent calls are retried.

    Example::

        >>> policy = RetryPolicy(jitter=0)
        >>> [policy.wait(n) for n in (1, 2, 5, 6)], policy.wait(1, retry_after=3.0)
        ([2.0, 4.0, 32.0, None], 3.0)
    """

    retries: int = 5
    backoff_s: float = 2.0
    jitter: float = 0.2
    #: A longer ``Retry-After`` (or backoff) ends the retries: a CLI never waits for hours.
    max_wait_s: float = 60.0
    statuses: frozenset[int] = frozenset({429, 502, 503})

    def wait(self, retry: int, retry_after: float | None = None) -> float | None:
        """Seconds to wait before retry number ``retry`` (1: the first), or ``None``: no
        more retries."""
        if retry > self.retries or (retry_after is not None and retry_after > self.max_wait_s):
            return None
        if retry_after is not None:
            return retry_after * (1 + random.uniform(0, self.jitter))
        backoff = min(self.backoff_s * 2 ** (retry - 1), self.max_wait_s)
        return backoff * random.uniform(1 - self.jitter, 1 + self.jitter)


def retry_after(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (a number or an HTTP date), ``None`` if absent or
    unreadable (:func:`torchstep.retryafter.seconds`).

    >>> retry_after("2"), retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), retry_after("soon")
    (2.0, 0.0, None)
    """
    return retryafter.seconds(value)


def segment(text: str) -> str:
    """``text`` as one segment of a URL path (every ``/`` and reserved character escaped):
    an id from a record or a command line never reaches another path.

    >>> segment("manual__2026-01-01T00:00:00+00:00/x")
    'manual__2026-01-01T00%3A00%3A00%2B00%3A00%2Fx'
    """
    return urllib.parse.quote(text, safe="")


class _NotSent(Exception):
    """The request never reached the server (refused, no such host, connect timeout)."""


class RestClient:
    """JSON calls to one REST API (``urllib``) with one-line :class:`SchedulerError` messages,
    retrying idempotent calls by :class:`RetryPolicy`. A subclass names its orchestrator
    (``backend``, ``api``), the fixes its errors give, and its credentials
    (:meth:`auth_headers`, read with :func:`~torchstep.schedulers.base.secret`).

    Example::

        api = RestClient("http://127.0.0.1:4200/api")
        runs = api.call("POST", "/flow_runs/filter", {"limit": 1}, idempotent=True)
    """

    backend: ClassVar[str] = "torchx"
    api: ClassVar[str] = "API"

    def __init__(self, endpoint: str, *, timeout: float = 30.0, retry: RetryPolicy = RetryPolicy()) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout
        self.retry = retry
        self.headers: dict[str, str] = {}  # credentials, when a subclass has them up front
        self._answered = False  # the server answered once: a refused connection is then retried

    def unreachable_fix(self) -> str:
        return "check the endpoint and the network"

    def auth_fix(self) -> str:
        return "check the credentials"

    def auth_headers(self) -> dict[str, str]:
        """The credentials sent with each call."""
        return self.headers

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        idempotent: bool | None = None,
        ok404: bool = False,
        auth: bool = True,
        on_conflict: Callable[[], Any] | None = None,
    ) -> Any:
        """``method path`` with ``body`` as JSON; the JSON answer (``None``: an empty one, or
        HTTP 404 with ``ok404``).

        Args:
            idempotent: whether the call may be repeated (default: GET, HEAD, PUT, DELETE,
                OPTIONS); only those are retried. A create made idempotent by a name the
                caller chose passes ``True`` with ``on_conflict``.
            on_conflict: when a retried call answers 409 (an earlier try was done, its
                answer lost), the answer is ``on_conflict()``: the existing object.

        Raises:
            SchedulerError: unreachable, refused, an HTTP error or an answer that is not JSON.
        """
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "PUT", "DELETE", "OPTIONS")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        headers.update(self.auth_headers() if auth else {})
        data = json.dumps(body).encode() if body is not None else None
        what = f"{self.backend}: {method} {path}"
        retry = 0
        while True:
            retry += 1
            try:
                status, answer_headers, raw = self._send(method, path, data, headers)
            except _NotSent as e:
                wait = self.retry.wait(retry) if self._answered else None
                if wait is None:
                    raise SchedulerError(
                        f"{self.backend}: cannot reach the {self.api} at {self.endpoint} ({e}); "
                        f"fix: {self.unreachable_fix()}"
                    ) from None
            except (http.client.HTTPException, OSError) as e:  # sent: the answer was lost
                wait = self.retry.wait(retry) if idempotent else None
                if wait is None:
                    done = "" if idempotent else "; it may or may not have been done"
                    raise SchedulerError(
                        f"{what}: the connection to {self.endpoint} was lost before the answer "
                        f"({_reason(e)}, {retry} tries){done}; fix: try again"
                    ) from None
            else:
                self._answered = True
                busy = status in self.retry.statuses and idempotent
                wait = self.retry.wait(retry, retry_after(answer_headers.get("Retry-After"))) if busy else None
                if wait is None:
                    if status == 409 and retry > 1 and on_conflict is not None:
                        return on_conflict()
                    return self._answer(method, path, status, raw, ok404=ok404, tries=retry)
            time.sleep(wait)

    def _send(self, method: str, path: str, data: bytes | None, headers: dict[str, str]) -> tuple[int, Any, bytes]:
        request = urllib.request.Request(self.endpoint + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.headers, e.read()
        except urllib.error.URLError as e:  # raised while connecting or sending
            if isinstance(e.reason, ssl.SSLError):
                raise SchedulerError(
                    f"{self.backend}: TLS with {self.endpoint} failed ({_reason(e.reason)}); fix: check "
                    "the endpoint's certificate (or SSL_CERT_FILE)"
                ) from None
            if isinstance(e.reason, ConnectionResetError | BrokenPipeError):
                raise e.reason from None  # the server took the connection and dropped it: maybe received
            raise _NotSent(_reason(e.reason)) from None

    def _answer(self, method: str, path: str, status: int, raw: bytes, *, ok404: bool, tries: int) -> Any:
        what = f"{self.backend}: {method} {path}"
        if status in (401, 403):
            raise SchedulerError(
                f"{self.backend}: the {self.api} at {self.endpoint} refused the credentials "
                f"({method} {path}: HTTP {status}); fix: {self.auth_fix()}",
                status=status,
            )
        if status == 404 and ok404:
            return None
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(text) if text.strip() else None
        except ValueError:
            data = text
        if status >= 400:
            detail = data.get("detail", text) if isinstance(data, dict) else text
            busy = f" (after {tries} tries)" if tries > 1 else ""
            raise SchedulerError(f"{what}: HTTP {status}{busy}: {' '.join(str(detail).split())[:500]}", status=status)
        if isinstance(data, str):
            raise SchedulerError(
                f"{what}: the answer is not JSON (a login page or a proxy?); fix: point the endpoint at the {self.api}",
                status=status,
            )
        return data


def _reason(e: BaseException | str) -> str:
    """A short reason for a network error (``[Errno 111] Connection refused``)."""
    if isinstance(e, str):
        return e
    return str(e) or type(e).__name__
