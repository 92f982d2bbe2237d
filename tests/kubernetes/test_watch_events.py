"""torchstep.kubernetes.watch.Watcher against a scripted client (no HTTP, deterministic): the
order of the events and the resourceVersion each watch resumes from, after a server timeout,
a broken stream and 410 Gone; an error that is not transient stops it; stop closes the stream."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubefake import ApiError
from torchstep.kubernetes.watch import Watcher


def pod(name: str, rv: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv}, "status": {"phase": phase}}


def event(kind_of_change: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind_of_change, "object": obj, "raw_object": obj}


class Stream:
    """Scripted events, then ``then`` raised (a broken stream) or the end (the server's timeout);
    ``block``: waits until closed (a quiet watch)."""

    def __init__(self, events: list[dict[str, Any]], then: BaseException | None = None, block: bool = False) -> None:
        self.events, self.then, self.block = events, then, block
        self.closed = threading.Event()

    def __iter__(self):
        yield from self.events
        if self.block:
            self.closed.wait(30)
            raise ConnectionResetError("closed")
        if self.then is not None:
            raise self.then

    def close(self) -> None:
        self.closed.set()


class Client:
    def __init__(self, streams: list[Stream], lists: list[dict[str, Any]]) -> None:
        self.streams, self.lists = streams, lists
        self.opened: list[str | None] = []

    def list_namespaced_job(self, namespace: str, **kw: Any) -> Any:
        return self.lists.pop(0)

    def watch(
        self, kind: str, namespace: str, *, label_selector: str, resource_version: str | None, timeout_seconds: int
    ) -> Stream:
        self.opened.append(resource_version)
        return self.streams.pop(0) if self.streams else Stream([], block=True)


def follow(client: Client) -> tuple[Watcher, list[tuple[str, str, str]]]:
    seen: list[tuple[str, str, str]] = []
    w = Watcher(
        "Pod",
        client,
        "ml",
        "a=b",
        list_objects=lambda stop: client.list_namespaced_job("ml"),
        on_list=lambda items: seen.extend(("LIST", o["metadata"]["name"], o["status"]["phase"]) for o in items),
        on_event=lambda t, o: seen.append((t, o["metadata"]["name"], o["status"]["phase"])),
        budget_s=10,
    )
    w.start()
    return w, seen


def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_events_in_order_resumed_from_the_last_version_after_a_timeout_and_a_broken_stream() -> None:
    bookmark = {
        "type": "BOOKMARK",
        "object": {"metadata": {"resourceVersion": "15"}},
        "raw_object": {"metadata": {"resourceVersion": "15"}},
    }
    client = Client(
        [
            Stream([event("ADDED", pod("p-1", "11")), event("MODIFIED", pod("p-0", "12", "Succeeded"))]),  # timeout
            Stream([bookmark], then=ConnectionResetError("reset by peer")),  # broken after a bookmark
            Stream([event("DELETED", pod("p-1", "16", "Failed"))]),
        ],
        [{"metadata": {"resourceVersion": "10"}, "items": [pod("p-0", "9")]}],
    )
    w, seen = follow(client)
    until(lambda: len(client.opened) >= 4, "the fourth watch")
    w.stop()
    w.join(10)
    assert not w.alive and w.error is None
    assert seen == [
        ("LIST", "p-0", "Running"),
        ("ADDED", "p-1", "Running"),
        ("MODIFIED", "p-0", "Succeeded"),
        ("DELETED", "p-1", "Failed"),
    ]
    assert client.opened[:4] == ["10", "12", "15", "16"]  # each from the last version seen
    assert w.relists == 0 and w.reconnects >= 3


def test_410_gone_lists_again_and_watches_from_the_new_list() -> None:
    client = Client(
        [Stream([event("ADDED", pod("p-1", "11"))], then=ApiError(410, "Expired: too old resource version"))],
        [
            {"metadata": {"resourceVersion": "10"}, "items": []},
            {"metadata": {"resourceVersion": "40"}, "items": [pod("p-1", "39", "Succeeded")]},
        ],
    )
    w, seen = follow(client)
    until(lambda: len(client.opened) >= 2, "the watch after the new list")
    w.stop()
    w.join(10)
    assert seen == [("ADDED", "p-1", "Running"), ("LIST", "p-1", "Succeeded")]
    assert client.opened[:2] == ["10", "40"] and w.relists == 1 and w.error is None


def test_an_error_that_is_not_transient_stops_the_watcher_with_it() -> None:
    client = Client(
        [Stream([], then=ApiError(403, "Forbidden: cannot watch pods"))],
        [{"metadata": {"resourceVersion": "10"}, "items": []}],
    )
    w, _ = follow(client)
    w.join(10)
    assert not w.alive
    assert isinstance(w.error, ApiError) and w.error.status == 403


def test_stop_closes_the_open_stream_at_once() -> None:
    quiet = Stream([], block=True)
    client = Client([quiet], [{"metadata": {"resourceVersion": "10"}, "items": []}])
    w, _ = follow(client)
    until(lambda: client.opened, "the watch to open")
    t0 = time.monotonic()
    w.stop()
    w.join(10)
    assert quiet.closed.is_set() and not w.alive and w.error is None
    assert time.monotonic() - t0 < 5  # not the 30 s the quiet stream would block
