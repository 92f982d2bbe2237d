"""What the watcher (:class:`~torchstep.kubernetes.JobGang`) and a run read from elsewhere
(:class:`~torchstep.kubernetes.remote.RemoteRun`) both do with a run's objects: read a
workload's state, decide what the states and preemptions of a run mean, and delete
everything the run's label selector finds."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from torchstep.errors import RunError
from torchstep.kubernetes.apiobj import get, http_status
from torchstep.kubernetes.preemption import Preemptions
from torchstep.kubernetes.retry import ApiRetriesExhausted, Interrupted
from torchstep.result import FAILED, PREEMPTED, SUCCEEDED

__all__ = ["BARE_POD", "GONE_MARGIN_S", "deletions", "job_state", "pod_state", "verdict", "wait_until_gone"]

#: A bare Pod of the run was preempted and must be created again by a watcher.
BARE_POD = "BARE_POD"
#: Seconds a deleted preempted pod may outlive its grace period before the watcher gives up.
GONE_MARGIN_S = 120.0


def job_state(job: Any) -> str | None:
    """A Job's state from its conditions.

    Args:
        job: the Job (a client object or its dict).

    Returns:
        ``SUCCEEDED``, ``FAILED``, or ``None`` while it runs.

    Example::

        >>> job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "SUCCEEDED"
        True
    """
    for c in get(job, "status", "conditions") or []:
        if get(c, "status") == "True" and get(c, "type") in ("Complete", "SuccessCriteriaMet"):
            return SUCCEEDED
        if get(c, "status") == "True" and get(c, "type") in ("Failed", "FailureTarget"):
            return FAILED
    return None


def pod_state(pod: Any) -> str | None:
    """A bare Pod's state from its phase: ``SUCCEEDED``, ``FAILED``, or ``None`` while it runs.

    Example::

        >>> pod_state({"status": {"phase": "Failed"}}) == "FAILED"
        True
    """
    return {"Succeeded": SUCCEEDED, "Failed": FAILED}.get(get(pod, "status", "phase"))


def verdict(states: Sequence[str | None], preemptions: Preemptions) -> str | None:
    """What a run's workload states and its preemptions decide, in the watcher's order: the
    preemption budget spent (``PREEMPTED``), a preempted bare Pod to run again
    (:data:`BARE_POD`), a workload failed (``FAILED``), every one succeeded (``SUCCEEDED``);
    ``None`` while it runs.

    Args:
        states: each workload's state (:func:`job_state`, :func:`pod_state`).
        preemptions: the run's preemptions seen so far.

    Returns:
        The decision, or ``None``.
    """
    if preemptions.exhausted:
        return PREEMPTED
    if preemptions.bare_pod is not None:
        return BARE_POD
    if FAILED in states:
        return FAILED
    if all(s == SUCCEEDED for s in states):
        return SUCCEEDED
    return None


def deletions(client: Any, namespace: str, selector: str) -> list[tuple[str, Callable[[], Any]]]:
    """The calls that delete every object of a run, in order: its Jobs and Pods with
    foreground propagation (their pods, and the Services and NetworkPolicies they own, go
    first), then any Service and NetworkPolicy left (one whose Job creation was cut short).
    Each is idempotent; the caller runs each even when another fails.

    Args:
        client: the Kubernetes client.
        namespace: the run's namespace.
        selector: the run's label selector.

    Returns:
        ``(what, call)`` pairs, ``what`` naming the kind for an error message.
    """

    def services() -> None:
        for svc in get(client.list_namespaced_service(namespace, label_selector=selector), "items") or []:
            client.delete_namespaced_service(get(svc, "metadata", "name"), namespace)

    def network_policies() -> None:
        delete = getattr(client, "delete_collection_namespaced_network_policy", None)
        if delete is not None:  # a client without NetworkPolicies (the test fakes) has none to delete
            delete(namespace, label_selector=selector)

    return [
        (
            "jobs",
            lambda: client.delete_collection_namespaced_job(
                namespace, label_selector=selector, propagation_policy="Foreground"
            ),
        ),
        (
            "pods",
            lambda: client.delete_collection_namespaced_pod(
                namespace, label_selector=selector, propagation_policy="Foreground"
            ),
        ),
        ("services", services),
        ("networkpolicies", network_policies),
    ]


def wait_until_gone(read: Callable[[], Any], what: str, grace_s: float, wait: Callable[[float], bool]) -> None:
    """Wait until a deleted preempted pod is gone: ``read()`` answers 404 (or returns
    ``None``: the name is another pod's now), within its grace period plus
    :data:`GONE_MARGIN_S` — what a watcher does before it creates the pod again.

    Args:
        read: reads the pod (raises the API's error; ``None``: not ours any more).
        what: the pod, for the error (``Pod <ns>/<name>``).
        grace_s: its ``terminationGracePeriodSeconds``.
        wait: waits the given seconds between two reads; ``True``: stop waiting (cancelled).

    Raises:
        RunError: the pod is still there after the deadline.
        Interrupted: ``wait`` said stop.
    """
    deadline = time.monotonic() + grace_s + GONE_MARGIN_S  # its processes first get the grace period
    while True:
        try:
            if read() is None:
                return
        except Exception as e:
            if http_status(e.error if isinstance(e, ApiRetriesExhausted) else e) == 404:
                return
            raise
        if time.monotonic() > deadline:
            raise RunError(
                what,
                "the preempted pod is still there after its grace period; fix: check the node it ran on (kubectl describe pod)",
            )
        if wait(1.0):
            raise Interrupted(f"waiting for {what} to go")
