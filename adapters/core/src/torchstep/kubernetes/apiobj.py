"""Reading Kubernetes API objects as ``JobGang`` gets them: the official client's models
(snake_case attributes, ``datetime`` timestamps) or plain dicts (camelCase keys, RFC 3339
text), from either the client or a test fake.

    >>> get({"status": {"startTime": "2026-11-24T10:00:00Z"}}, "status", "start_time")
    '2026-11-24T10:00:00Z'
    >>> when("2026-11-24T10:00:00Z")
    1795514400.0
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from torchstep.kubernetes.pod import CONTAINER_NAME


def http_status(error: BaseException) -> int | None:
    """The HTTP status of an API error (the official client's ``ApiException.status``).

    Args:
        error: the exception a client call raised.

    Returns:
        The status (409, 404...), or ``None`` when the error carries none.
    """
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def uid_of(obj: Any) -> str | None:
    """An object's ``metadata.uid`` (``None`` when it has none).

    Args:
        obj: an API object from the official client, or the same object as a dict.
    """
    uid = get(obj, "metadata", "uid")
    return str(uid) if uid else None


def controller_uid(obj: Any) -> str | None:
    """The uid of the object's controller (its ``ownerReferences`` entry with
    ``controller: true``: the Job of a Job's pod), ``None`` for a bare object.

    Args:
        obj: an API object from the official client, or the same object as a dict.

    >>> controller_uid({"metadata": {"ownerReferences": [{"kind": "Job", "uid": "u1", "controller": True}]}})
    'u1'
    """
    for ref in get(obj, "metadata", "owner_references") or []:
        if get(ref, "controller") is True and get(ref, "uid"):
            return str(get(ref, "uid"))
    return None


def terminated(pod: Any) -> Any:
    """The main container's ``state.terminated`` (``None`` while it runs).

    Args:
        pod: a Pod, API object from the official client, or the same object as a dict.
    """
    for cs in get(pod, "status", "container_statuses") or []:
        if get(cs, "name") == CONTAINER_NAME:
            return get(cs, "state", "terminated")
    return None


def termination(pod: Any) -> tuple[int | None, str | None]:
    """The main container's exit code and termination message (``None``s while it runs).

    Args:
        pod: a Pod, API object from the official client, or the same object as a dict.

    Returns:
        ``(exit_code, message)``.
    """
    term = terminated(pod)
    if term is None:
        return None, None
    code = get(term, "exit_code")
    return (int(code) if code is not None else None), get(term, "message")


def when(value: Any) -> float | None:
    """An API timestamp (a ``datetime`` from the official client, RFC 3339 text in dicts)
    as epoch seconds.

    Args:
        value: a ``datetime``, RFC 3339 text or ``None``.

    Returns:
        Epoch seconds, or ``None`` for ``None`` or unreadable text.
    """
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str) and value:
        try:
            return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def began(workload: Any) -> float | None:
    """When a workload started on the cluster: its ``status.startTime``, else its creation.

    Args:
        workload: a Job or Pod, API object from the official client, or the same object as a dict.

    Returns:
        Epoch seconds, or ``None`` when neither time is known.
    """
    return when(get(workload, "status", "start_time")) or when(get(workload, "metadata", "creation_timestamp"))


def age_order(pod: Any) -> tuple[float, float, bool]:
    """Pods of one replica from oldest to latest. Creation times have whole seconds, so a
    replacement made in its predecessor's second is told apart by when each finished (a
    running pod is the latest), then by a failed one being the older.

    Args:
        pod: a Pod, API object from the official client, or the same object as a dict.

    Returns:
        A sort key: sort the replica's pods by it, the latest is last.
    """
    created = when(get(pod, "metadata", "creation_timestamp")) or 0.0
    term, phase = terminated(pod), get(pod, "status", "phase")
    ended = term is not None or phase in ("Succeeded", "Failed")
    return created, (when(get(term, "finished_at")) or 0.0) if ended else float("inf"), phase != "Failed"


def get(obj: Any, *path: str) -> Any:
    """``obj.a.b`` for API objects and ``obj["a"]["b"]`` for dicts (camelCase keys too).

    Args:
        obj: an API object from the official client, or the same object as a dict.
        *path: the snake_case field names, outermost first.

    Returns:
        The value, or ``None`` when a field on the way is missing.
    """
    for key in path:
        if obj is None:
            return None
        if isinstance(obj, dict):
            camel = key.split("_")[0] + "".join(w.title() for w in key.split("_")[1:])
            obj = obj.get(key, obj.get(camel))
        else:
            obj = getattr(obj, key, None)
    return obj
