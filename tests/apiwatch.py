"""The watch API both fake API servers serve (``tests/kubehttp.py``'s scripted cluster and
``tests/cluster``'s real one), with the real API server's resourceVersion semantics
(https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):

- every change of a Pod or a Job gets the next ``resourceVersion`` (one counter for the whole
  server, as etcd's revision); ``get`` and ``list`` answer it (a list in its ``metadata``);
- ``GET ...?watch=true&resourceVersion=R`` streams newline-delimited JSON events
  (``ADDED``, ``MODIFIED``, ``DELETED``: the object as it was last) of the objects the label
  selector matches, every change after R, then the changes as they happen; without R (or
  ``0``) a synthetic ``ADDED`` for every current object first; ``timeoutSeconds`` ends the
  stream; ``allowWatchBookmarks=true`` adds a ``BOOKMARK`` (only ``metadata.resourceVersion``)
  after a second without an event;
- a resourceVersion older than the history kept (the last :data:`HISTORY` changes, or all of
  them after a ``compact`` fault) is answered with an ``ERROR`` event whose object is a
  ``Status`` with code 410 (``Expired``), as the API server does once etcd compacted it:
  the client must list again.

Changes are found by comparing each object's view with the one last seen, whenever the API is
read (a watch looks every 50 ms) and before an object is removed (so a pod deleted at once
is still seen, as etcd keeps every write): a scripted pod whose status only depends on the
clock changes without any write.
"""

from __future__ import annotations

import json
import re
from collections import deque
from typing import Any

#: The kinds that are watched (and versioned).
WATCHED = ("Pod", "Job")
#: How many changes are kept for a watch that resumes (older ones: 410 Gone).
HISTORY = 2000


def matches(labels: dict[str, str], selector: str | None) -> bool:
    """Whether ``labels`` match a label selector as the API server reads it: equality
    (``a=b``, ``a==b``, ``a!=b``: true where ``a`` is missing), existence (``a``, ``!a``) and
    sets (``a in (x,y)``, ``a notin (x,y)``), comma-separated (the KubernetesPodOperator's
    ``already_checked!=True,!airflow-worker``)."""
    for term in (t.strip() for t in re.split(r",(?![^(]*\))", selector or "")):
        if not term:
            continue
        found = re.fullmatch(r"(\S+)\s+(in|notin)\s+\((.*)\)", term)
        if found:
            key, op, values = found.group(1), found.group(2), {v.strip() for v in found.group(3).split(",")}
            if (labels.get(key) in values) != (op == "in"):
                return False
        elif "!=" in term:
            key, value = (x.strip() for x in term.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = (x.strip() for x in term.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class ApiWatch:
    """Mixin: the holder sets ``lock``, ``objects`` ({(kind, ns, name): object}), ``counters``
    and ``view(kind, obj)``, and calls :meth:`init_watch` in its ``__init__``."""

    lock: Any
    objects: dict[tuple[str, str, str], dict[str, Any]]
    counters: dict[str, int]

    def view(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - the holder's
        raise NotImplementedError

    def init_watch(self) -> None:
        self.revision = 1
        self.compacted = 0  # changes up to this revision are forgotten
        self.history: deque[tuple[int, str, str, str, dict[str, Any]]] = deque()  # (rv, type, kind, ns, object)
        # key -> (rv, uid, json, view)
        self.known: dict[tuple[str, str, str], tuple[int, str, str, dict[str, Any]]] = {}
        self.cut_watches = 0
        self.expire_cut = False  # a cut also compacts: the watch was away long enough
        self.counters.update(watch_requests=0, watches_cut=0, watches_expired=0, lists=0)

    # -- versions -------------------------------------------------------------------------------------
    def sync_watch(self) -> None:
        """Record every change since the last look (the caller holds the lock)."""
        current = {key for key in self.objects if key[0] in WATCHED}
        for key in list(self.known):
            rv, uid, _, last = self.known[key]
            obj = self.objects.get(key)
            if obj is None or obj["metadata"].get("uid") != uid:  # gone (or another object of that name)
                self._change("DELETED", key, last)
                del self.known[key]
        for key in current:
            view = self.view(key[0], self.objects[key])
            view["metadata"].pop("resourceVersion", None)
            text = json.dumps(view, sort_keys=True)
            old = self.known.get(key)
            if old is not None and old[2] == text:
                continue
            rv = self._change("ADDED" if old is None else "MODIFIED", key, view)
            self.known[key] = (rv, str(view["metadata"].get("uid")), text, view)

    def _change(self, kind_of_change: str, key: tuple[str, str, str], view: dict[str, Any]) -> int:
        self.revision += 1
        out = json.loads(json.dumps(view))
        out["metadata"]["resourceVersion"] = str(self.revision)
        self.history.append((self.revision, kind_of_change, key[0], key[1], out))
        while len(self.history) > HISTORY:
            self.compacted = self.history.popleft()[0]
        return self.revision

    def versioned(self, kind: str, ns: str, name: str, view: dict[str, Any]) -> dict[str, Any]:
        """``view`` with its resourceVersion (the caller holds the lock, after :meth:`sync_watch`)."""
        known = self.known.get((kind, ns, name))
        if known is not None:
            view["metadata"]["resourceVersion"] = str(known[0])
        return view

    def compact(self) -> None:
        """Forget every change so far (etcd's compaction): a watch from before now gets 410."""
        self.compacted = self.revision
        self.history.clear()

    # -- one watch request ---------------------------------------------------------------------------
    def watch_start(self, kind: str, ns: str, selector: str | None, since: str | None) -> tuple[int, list[Any]] | None:
        """Where a watch from resourceVersion ``since`` starts and its first events; ``None``
        when ``since`` is too old (410)."""
        with self.lock:
            self.counters["watch_requests"] += 1
            self.sync_watch()
            if since in (None, "", "0"):
                items = [
                    v
                    for (k, n, _), (_, _, _, v) in self.known.items()
                    if k == kind and n == ns and matches(v["metadata"].get("labels") or {}, selector)
                ]
                return self.revision, [
                    ("ADDED", self.versioned(kind, ns, o["metadata"]["name"], json.loads(json.dumps(o)))) for o in items
                ]
            rv = int(since)
            if rv < self.compacted:
                self.counters["watches_expired"] += 1
                return None
            return rv, []

    def watch_next(self, kind: str, ns: str, selector: str | None, after: int) -> tuple[int, list[Any]]:
        """The events after ``after`` (the new position and the events)."""
        with self.lock:
            self.sync_watch()
            events = [
                (t, o)
                for rv, t, k, n, o in self.history
                if rv > after and k == kind and n == ns and matches(o["metadata"].get("labels") or {}, selector)
            ]
            return self.revision, events

    def watch_cut(self) -> bool:
        """Whether a watch about to send an event is to be cut now (``cut_watches``; it counts one)."""
        with self.lock:
            if self.cut_watches <= 0:
                return False
            self.cut_watches -= 1
            self.counters["watches_cut"] += 1
            if self.expire_cut:
                self.compact()
            return True

    def arm_watch_faults(self, body: dict[str, Any]) -> None:
        """``cut_watches: N`` (the next N watches that have an event to send are closed
        without it, as a reset connection; with ``expire: true`` each cut also compacts, so
        that watch's reconnection gets 410) and ``compact: true`` (the caller holds the lock)."""
        if "cut_watches" in body:
            self.cut_watches += int(body["cut_watches"])
            self.expire_cut = bool(body.get("expire"))
        if body.get("compact"):
            self.sync_watch()
            self.compact()
