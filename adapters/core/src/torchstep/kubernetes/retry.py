"""Transient Kubernetes API errors, retried with backoff within a bounded budget.

An API server under load answers 429 (API Priority and Fairness, with ``Retry-After``),
500/502/503/504 (an apiserver restarting, a load balancer in front of it, etcd leader
election), or drops the connection. None of these says anything about the step, so one of
them must not fail it (and delete its whole gang of pods). :func:`call_api` repeats an
*idempotent* call (a read, a list, a delete) after such an error: it waits ``Retry-After``
when the server says how long, else an exponential backoff (0.2 s doubling to 5 s, with
jitter), until the call succeeds or ``budget_s`` seconds of failures have passed; then it
raises :class:`ApiRetriesExhausted` (a retryable :class:`~torchstep.RunError` naming the call
and the last HTTP status). Any other error (404, 403, 409, 422...) propagates at once.

A create is not idempotent (a 500 may come after the object was made): it is retried only
on 429, which the API server answers before doing anything; attach-or-create then handles
the rest (a 409 on a retry is an object of this run's name).

    >>> class Busy(Exception):
    ...     status, reason, headers = 429, "Too Many Requests", {"Retry-After": "0"}
    >>> answers = [Busy(), "ok"]
    >>> def read():
    ...     answer = answers.pop(0)
    ...     if isinstance(answer, Exception):
    ...         raise answer
    ...     return answer
    >>> call_api("read Job ml/x", read, budget_s=5)
    'ok'
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Collection
from typing import Any, TypeVar

from torchstep import retryafter
from torchstep.errors import RunError
from torchstep.kubernetes.apiobj import http_status

T = TypeVar("T")

#: HTTP statuses that say nothing about the request itself: the server is busy or restarting.
RETRYABLE_STATUS = frozenset({429, 500, 502, 503, 504})
#: Seconds of consecutive failures of one call before the step gives up (``JobGang.api_retry_budget_s``).
API_RETRY_BUDGET_S = 60.0
#: ... for each delete call of the cleanup (a cancel must end within its grace period).
DELETE_RETRY_BUDGET_S = 20.0
#: The first backoff and its cap, in seconds (doubled after each failure, with up to 50 % jitter).
BACKOFF_FIRST_S, BACKOFF_MAX_S = 0.2, 5.0
#: The longest ``Retry-After`` honoured as given (a longer one is cut to this).
RETRY_AFTER_MAX_S = 30.0
#: Exceptions of the official client's HTTP stack that mean the connection failed (by name:
#: core does not depend on urllib3). ``ConnectionError`` and ``TimeoutError`` count too.
_CONNECTION_ERRORS = frozenset(
    {
        "ProtocolError",
        "MaxRetryError",
        "NewConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "IncompleteRead",
        "RemoteDisconnected",
    }
)
log = logging.getLogger("torchstep.kubernetes")


class ApiRetriesExhausted(RunError):
    """A call kept failing with transient errors for the whole retry budget.

    Args:
        call: the API call and its object, e.g. ``"read_namespaced_job_status Job ml/train-1a2b"``.
        error: the last error the client raised.
        tries: how many times the call was made.
        elapsed_s: seconds from the first try to the last failure.

    Attributes:
        error: the last error (its ``status`` is :attr:`status`).
        status: the last HTTP status, ``None`` for a connection error.
    """

    def __init__(self, call: str, error: BaseException, tries: int, elapsed_s: float) -> None:
        self.error = error
        self.status = http_status(error)
        said = f"HTTP {self.status}" if self.status is not None else f"{type(error).__name__}: {error}"
        super().__init__(
            call,
            f"the Kubernetes API server kept failing ({said}) for {elapsed_s:.0f} s, {tries} tries; fix: check the "
            "API server's health and load (429: its API priority and fairness limits), or raise api_retry_budget_s",
        )


class Interrupted(Exception):
    """The ``stop`` event was set while a call waited to be retried."""


def transient(error: BaseException, statuses: Collection[int] = RETRYABLE_STATUS, connection: bool = True) -> bool:
    """Whether ``error`` is worth the same call again.

    Args:
        error: what a client call raised.
        statuses: the HTTP statuses that are.
        connection: whether a failed connection (reset, refused, timed out) is.

    Returns:
        True for one of ``statuses``, or a connection failure when ``connection``.

    >>> transient(ConnectionResetError()), transient(ConnectionResetError(), connection=False)
    (True, False)
    """
    status = http_status(error)
    if status is not None:
        return status in statuses
    if not connection:
        return False
    return isinstance(error, ConnectionError | TimeoutError) or type(error).__name__ in _CONNECTION_ERRORS


def retry_after(error: BaseException) -> float | None:
    """The seconds the server asked to wait (``Retry-After``: seconds or an HTTP date), capped at
    :data:`RETRY_AFTER_MAX_S`; ``None`` when it said nothing readable.

    Args:
        error: what a client call raised (the official ``ApiException`` keeps the headers).

    Returns:
        Seconds, or ``None``.

    >>> class E(Exception):
    ...     headers = {"Retry-After": "2"}
    >>> retry_after(E()), retry_after(ValueError())
    (2.0, None)
    """
    headers = getattr(error, "headers", None)
    if not headers:
        return None
    try:
        value = headers.get("Retry-After") or headers.get("retry-after")
    except AttributeError:
        return None
    secs = retryafter.seconds(value if isinstance(value, str) else None)
    return min(secs, RETRY_AFTER_MAX_S) if secs is not None else None


class Backoff:
    """The waits between tries of one call (see the module docstring): ``Retry-After`` when
    the server said how long, else 0.2 s doubling to 5 s with jitter, until ``budget_s``
    seconds of consecutive failures.

    Args:
        what: the call and its object, for the log and the error.
        budget_s: the most seconds of failures before giving up.
        stop: when set while waiting, :class:`Interrupted` is raised.
        logger: where each retry is logged (default: this module's logger).
    """

    def __init__(
        self, what: str, budget_s: float, stop: threading.Event | None = None, logger: logging.Logger | Any = None
    ) -> None:
        self.what = what
        self.budget_s = budget_s
        self.stop = stop
        self.log = logger or log
        self.reset()

    def reset(self) -> None:
        """The call succeeded: the next failure starts a new budget."""
        self.started: float | None = None
        self.delay = BACKOFF_FIRST_S
        self.tries = 0

    def wait(self, error: BaseException) -> None:
        """Wait before the next try after the transient ``error``.

        Args:
            error: what the call raised.

        Raises:
            ApiRetriesExhausted: the budget is spent (``error`` is its cause).
            Interrupted: ``stop`` was set while waiting.
        """
        now = time.monotonic()
        if self.started is None:
            self.started = now
        self.tries += 1
        asked = retry_after(error)
        wait = asked if asked is not None else self.delay * (1 + random.random() / 2)
        self.delay = min(self.delay * 2, BACKOFF_MAX_S)
        elapsed = now - self.started
        if elapsed + wait > self.budget_s:
            raise ApiRetriesExhausted(self.what, error, self.tries, elapsed) from error
        status = http_status(error)
        self.log.warning(
            "torchstep: %s: %s; trying again in %.1f s",
            self.what,
            f"HTTP {status}" if status is not None else type(error).__name__,
            wait,
        )
        if self.stop is not None:
            if self.stop.wait(wait):
                raise Interrupted(self.what) from error
        else:
            time.sleep(wait)


def call_api(
    what: str,
    fn: Callable[[], T],
    *,
    budget_s: float = API_RETRY_BUDGET_S,
    stop: threading.Event | None = None,
    statuses: Collection[int] = RETRYABLE_STATUS,
    connection: bool = True,
    logger: logging.Logger | Any = None,
) -> T:
    """``fn()``, made again after a transient error (see the module docstring).

    Args:
        what: the call and its object, for the log and the error.
        fn: the call (idempotent unless ``statuses`` holds only statuses answered before
            anything was done, like 429).
        budget_s: the most seconds of failures before giving up.
        stop: when set while waiting to retry, :class:`Interrupted` is raised.
        statuses: the HTTP statuses retried.
        connection: whether a failed connection is retried.
        logger: where each retry is logged (default: this module's logger).

    Returns:
        What ``fn`` returned.

    Raises:
        ApiRetriesExhausted: transient errors for ``budget_s`` seconds.
        Interrupted: ``stop`` was set while waiting.
        Exception: any other error of ``fn``, at once.
    """
    backoff = Backoff(what, budget_s, stop, logger)
    backoff.started = time.monotonic()  # the budget counts the first try's time too
    while True:
        try:
            return fn()
        except Exception as e:
            if not transient(e, statuses, connection):
                raise
            backoff.wait(e)
