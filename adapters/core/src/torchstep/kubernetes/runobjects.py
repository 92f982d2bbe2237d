"""What the watcher (:class:`~torchstep.kubernetes.JobGang`) and a run read from elsewhere
(:class:`~torchstep.kubernetes.remote.RemoteRun`) both do with a run's objects: read a Job's
state from its conditions, and delete everything the run's label selector finds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchstep.kubernetes.apiobj import get
from torchstep.result import FAILED, SUCCEEDED

__all__ = ["deletions", "job_state"]


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
