"""How :class:`~torchstep.kubernetes.JobGang` follows a run's pods and Jobs: the Kubernetes
watch API (https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes),
not a read of every object every few seconds.

One :class:`Watcher` per kind (Pods, Jobs) lists the run's objects by label once (the list's
``resourceVersion`` is where the watch starts), then watches them from there: every
``ADDED``/``MODIFIED``/``DELETED`` event goes to the watcher's callback, in order, so nothing
that happens between two reads is missed (a pod evicted and deleted at once is seen with its
``DisruptionTarget`` condition, in its ``DELETED`` event). Each watch request ends after
:data:`WATCH_TIMEOUT_S` (the server closes it; a connection that died silently is caught by
the client's read timeout, :data:`WATCH_READ_TIMEOUT_S`) and the next one resumes from the
last ``resourceVersion`` seen (``BOOKMARK`` events move it too), so no slow poll is needed as
a safety net. A broken stream (a reset connection, a 5xx, 429) is resumed after the backoff
of :mod:`torchstep.kubernetes.retry`, within the same budget as any API call; ``410 Gone``
(the version was compacted away) lists again and resumes from the new list. :meth:`Watcher.stop`
closes the open stream at once.

A client without a ``watch`` method (:class:`WatchingClient`) is read every ``poll_interval``
instead, as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from torchstep.kubernetes.apiobj import get, http_status
from torchstep.kubernetes.retry import API_RETRY_BUDGET_S, ApiRetriesExhausted, Backoff, Interrupted, transient

#: Seconds the API server keeps one watch request open (``timeoutSeconds``).
WATCH_TIMEOUT_S = 60
#: The client's read timeout on a watch: longer than :data:`WATCH_TIMEOUT_S`, so only a
#: connection that died without a word (no end, no reset) reaches it.
WATCH_READ_TIMEOUT_S = 90.0
log = logging.getLogger("torchstep.kubernetes")

__all__ = ["WATCH_TIMEOUT_S", "WatchStream", "Watcher", "WatchingClient"]


class WatchStream(Protocol):
    """One open watch request: its events (the official client's ``Watch.stream`` dicts:
    ``type``, ``object``, ``raw_object``), and a :meth:`close` that ends them from another thread."""

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """The events, until the server ends the request.

        Returns:
            An iterator of event dicts.
        """
        ...

    def close(self) -> None:
        """End the stream now (from any thread); the iteration then stops or raises."""
        ...


@runtime_checkable
class WatchingClient(Protocol):
    """A client that can watch (:class:`~torchstep.kubernetes.OfficialClient` does): it lists
    the Jobs too (official client names), and opens watches."""

    def list_namespaced_job(self, namespace: str, **kwargs: Any) -> Any:
        """List the Jobs a ``label_selector`` keyword selects (``BatchV1Api``).

        Args:
            namespace: the Jobs' namespace.
            **kwargs: the official client's keywords.

        Returns:
            A list object whose ``items`` are the Jobs, with ``metadata.resourceVersion``.
        """
        ...

    def watch(
        self, kind: str, namespace: str, *, label_selector: str, resource_version: str | None, timeout_seconds: int
    ) -> WatchStream:
        """Watch the objects of ``kind`` (``Pod`` or ``Job``) that ``label_selector`` selects.

        Args:
            kind: ``Pod`` or ``Job``.
            namespace: their namespace.
            label_selector: the run's labels.
            resource_version: where to start (a list's ``resourceVersion``).
            timeout_seconds: when the server ends the request.

        Returns:
            The open stream.
        """
        ...


def resource_version(obj: Any) -> str | None:
    """An object's (or a list's) ``metadata.resourceVersion``, ``None`` when it has none.

    Args:
        obj: an API object or list, or the same as a dict.

    Returns:
        The version, as text.

    >>> resource_version({"metadata": {"resourceVersion": "42"}})
    '42'
    """
    rv = get(obj, "metadata", "resource_version")
    return str(rv) if rv else None


class Watcher:
    """Follow one kind of a run's objects (see the module docstring) in a daemon thread.

    Args:
        kind: ``Pod`` or ``Job``.
        client: a client with a ``watch`` method.
        namespace: the run's namespace.
        selector: the run's label selector.
        list_objects: lists the objects (retried after transient errors by the caller).
        on_list: called with every object of each list (the first one, and after a 410).
        on_event: called with each event's type and object.
        budget_s: the most seconds of consecutive failures before :attr:`error` is set.
        logger: where reconnections are logged.

    Attributes:
        error: what stopped the watcher for good (``None`` while it runs or after :meth:`stop`).
        relists: how many times it listed again after ``410 Gone``.
        reconnects: how many watch requests it opened after the first.
    """

    def __init__(
        self,
        kind: str,
        client: WatchingClient,
        namespace: str,
        selector: str,
        *,
        list_objects: Callable[[threading.Event], Any],
        on_list: Callable[[Iterable[Any]], None],
        on_event: Callable[[str, Any], None],
        budget_s: float = API_RETRY_BUDGET_S,
        logger: logging.Logger | Any = None,
    ) -> None:
        self.kind = kind
        self.client = client
        self.namespace = namespace
        self.selector = selector
        self.list_objects = list_objects
        self.on_list = on_list
        self.on_event = on_event
        self.budget_s = budget_s
        self.log = logger or log
        self.error: BaseException | None = None
        self.relists = 0
        self.reconnects = 0
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._lock = threading.Lock()
        self.listed = threading.Event()  # the first list was delivered
        self._thread = threading.Thread(target=self._run, name=f"watch-{kind.lower()}s", daemon=True)

    def start(self) -> None:
        """Start following in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop at once: the open stream is closed."""
        self._stop.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception as e:  # closing is best effort: the thread is a daemon
                self.log.debug("torchstep: closing the %s watch: %s", self.kind, e)

    @property
    def alive(self) -> bool:
        """Whether the watcher's thread still runs."""
        return self._thread.is_alive()

    def join(self, timeout: float) -> None:
        """Wait for the thread to end.

        Args:
            timeout: the most seconds to wait.
        """
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _list(self) -> str | None:
        listed = self.list_objects(self._stop)
        self.on_list(get(listed, "items") or [])
        self.listed.set()
        return resource_version(listed)

    def _run(self) -> None:
        try:
            self._follow()
        except Interrupted:
            pass
        except BaseException as e:
            if not self._stop.is_set():
                self.error = e
                self.listed.set()
                self.log.warning("torchstep: watching %ss stopped: %s", self.kind, e)

    def _follow(self) -> None:
        version = self._list()
        backoff = Backoff(f"watch {self.kind}s {self.namespace} ({self.selector})", self.budget_s, self._stop, self.log)
        opened = 0
        while not self._stop.is_set():
            try:
                stream = self.client.watch(
                    self.kind,
                    self.namespace,
                    label_selector=self.selector,
                    resource_version=version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                )
                with self._lock:
                    self._stream = stream
                if self._stop.is_set():  # stopped while opening: close what was just opened
                    stream.close()
                    return
                opened += 1
                self.reconnects = opened - 1
                for event in stream:
                    if self._stop.is_set():
                        return
                    backoff.reset()
                    kind_of_change = str(event.get("type"))
                    raw = event.get("raw_object") or {}
                    version = resource_version(raw) or version
                    if kind_of_change in ("ADDED", "MODIFIED", "DELETED"):
                        self.on_event(kind_of_change, event.get("object", raw))
            except Exception as e:
                if self._stop.is_set():
                    return
                cause = e.error if isinstance(e, ApiRetriesExhausted) else e
                if http_status(cause) == 410:  # compacted: the state now, then its changes
                    self.log.info(
                        "torchstep: the %s watch's version %s expired (410 Gone): listing again", self.kind, version
                    )
                    self.relists += 1
                    version = self._list()
                    continue
                if not transient(cause):
                    raise
                backoff.wait(cause)  # raises ApiRetriesExhausted past the budget
            finally:
                with self._lock:
                    self._stream = None
