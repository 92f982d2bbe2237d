"""What the watcher (:class:`~torchstep.kubernetes.JobGang`) and a run read from elsewhere
(:class:`~torchstep.kubernetes.remote.RemoteRun`) both do with a run's objects: read a
workload's state, decide what the states and preemptions of a run mean, and delete
everything the run's label selector finds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torchstep.kubernetes.apiobj import get
from torchstep.kubernetes.preemption import Preemptions
from torchstep.result import FAILED, PREEMPTED, SUCCEEDED

__all__ = ["BARE_POD", "deletions", "job_state", "pod_state", "verdict"]

#: A bare Pod of the run was preempted and must be created again by a watcher.
BARE_POD = "BARE_POD"


def job_state(job: Any) -> str | None:
    """A Job's state from its conditions.

    Args:
        job: the Job (a client object or its dict).

    Returns:
        ``SUCCEEDED``, ``FAILED``, or ``None`` while it runs.

    Example::

        >>> job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
        'SUCCEEDED'
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

        >>> pod_state({"status": {"phase": "Failed"}})
        'FAILED'
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
