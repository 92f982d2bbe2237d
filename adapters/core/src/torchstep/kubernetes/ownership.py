"""Which Kubernetes objects belong to a run: decided by uid, never by labels alone.

Labels are derived from the run id and the run ids of most orchestrators are predictable,
so anyone allowed to create Jobs or Pods in the step's namespace can copy them
(``torchstep render`` prints them). What they cannot copy is an object's ``metadata.uid``,
given by the API server when the object is created:

- a run knows the uid of every workload it created (read back from the create call) or
  attached to; a **pod** counts (its log followed, its result collected) only when its
  controlling ``ownerReferences`` entry names one of the run's Jobs by uid, or, for a
  bare-Pod role, when it *is* that Pod (same uid). Any other pod matching the run's label
  selector is an impostor: ignored, and reported once in the step log;
- where the orchestrator keeps state between tries (a ``store``: Airflow's task state
  store), the uid is recorded there right after the create call returns
  (:func:`record_uid`, under :data:`UIDS_KEY`), before anything else happens, and attaching
  to an existing workload requires that recorded uid: one with the run's labels and
  another uid is refused by name (:func:`refusal`), never adopted, never deleted.

Where nothing survives the watcher (KFP, Prefect), attaching accepts the run's labels; what
that leaves open and what a cluster admin does about it is in ``docs/security.md``.

    >>> owners = Owners()
    >>> owners.add("Job", "train-0", "uid-job")
    >>> owners.owns({"metadata": {"name": "train-0-0-x", "ownerReferences": [
    ...     {"kind": "Job", "name": "train-0", "uid": "uid-job", "controller": True}]}})
    True
    >>> owners.owns({"metadata": {"name": "evil", "uid": "uid-evil"}})
    False
"""

from __future__ import annotations

import json
from typing import Any

from torchstep.errors import RunError, SpecError
from torchstep.kubernetes.apiobj import controller_uid, get, http_status, uid_of

#: The key, in an orchestrator's state store, of the uids of the workloads a run created:
#: ``{workload name: uid}`` (renaming it breaks the reattach of tries in flight).
UIDS_KEY = "torchstep_workload_uids"


def recorded_uids(store: Any) -> dict[str, str]:
    """The uids recorded in ``store`` (``get``/``set`` of JSON values) by :func:`record_uid`;
    a malformed value counts as none recorded (attaching is then refused, never allowed).

    Args:
        store: the orchestrator's state between tries (``get``/``set`` of JSON values).

    Returns:
        Workload name → uid.
    """
    value = store.get(UIDS_KEY)
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, str) and v}


def record_uid(store: Any, name: str, uid: str) -> None:
    """Record that this run created the workload ``name`` with ``uid`` (call it as soon as
    the create call returned: a try that crashes later can then attach to it). Raises what
    the store raises: a run whose uid could not be recorded must not go on (it would be
    refused by its own retry).

    Args:
        store: the orchestrator's state between tries (``get``/``set`` of JSON values).
        name: the workload's name.
        uid: its ``metadata.uid`` as the create call returned it.
    """
    uids = recorded_uids(store)
    uids[name] = uid
    store.set(UIDS_KEY, uids)


def refusal(kind: str, namespace: str, name: str, problem: str) -> SpecError:
    """The error for an existing object a run will not use (named by ``kind ns/name``).

    A :class:`~torchstep.SpecError`, not a :class:`~torchstep.RunError`, though it is found
    at run time: object names are derived from the run id the user (or orchestrator) chose,
    and that name is taken by an object this run did not create. Retrying the same step
    meets the same object; choosing another run id or namespace (or deleting that object)
    is the fix, as for any bad input.

    Args:
        kind: ``Job``, ``Pod`` or ``Service``.
        namespace: the run's namespace.
        name: the object's name.
        problem: why it is not this run's (its labels, its uid).

    Returns:
        The :class:`~torchstep.SpecError` to raise.
    """
    return SpecError(
        f"{kind} {namespace}/{name}",
        "kubernetes",
        f"already exists and was not created by this run ({problem})",
        fix="delete that object, or give this step another name or namespace; torchstep never adopts or deletes "
        "objects that are not its own (who may create them in this namespace: docs/security.md)",
    )


def refused_creation(kind: str, namespace: str, name: str, error: BaseException) -> RunError:
    """The error for an object the API server would not create (any answer but 409, which
    is attach-or-create's): one line with the HTTP status, the server's message and the fix.
    Retryable, as the raw API error was: a quota or a busy API server may let a retry in.

    Args:
        kind: ``Job``, ``Pod`` or ``Service``.
        namespace: the run's namespace.
        name: the object's name.
        error: what the client raised (the official client's ``ApiException``, or a
            connection error).

    Returns:
        The :class:`~torchstep.RunError` to raise from ``error``.

    >>> class Forbidden(Exception):
    ...     status, reason, body = 403, "Forbidden", '{"message": "jobs.batch is forbidden: User x cannot create"}'
    >>> print(refused_creation("Job", "ml", "train-1a2b", Forbidden()))  # doctest: +NORMALIZE_WHITESPACE
    Job ml/train-1a2b: the API server refused its creation (HTTP 403 Forbidden: jobs.batch is forbidden: User x
    cannot create); fix: let the step's identity create jobs in namespace ml (RBAC), or run it in another namespace
    """
    status = http_status(error)
    said = _server_message(error)
    if status is None:
        what = f"could not create it ({type(error).__name__}: {said})"
        fix = "check that the Kubernetes API server is reachable from here"
    else:
        reason = getattr(error, "reason", None)
        what = f"the API server refused its creation (HTTP {status}{f' {reason}' if reason else ''}: {said})"
        fix = {
            403: f"let the step's identity create {_PLURALS.get(kind, kind.lower() + 's')} in namespace {namespace} "
            "(RBAC), or run it in another namespace",
            404: f"create namespace {namespace}, or run the step in another one",
            422: "the object is invalid for this cluster's Kubernetes version: `torchstep render` prints it",
        }.get(status, "check the API server's health; a retry may succeed")
    return RunError(f"{kind} {namespace}/{name}", f"{what}; fix: {fix}")


_PLURALS = {"NetworkPolicy": "networkpolicies"}


def _server_message(error: BaseException) -> str:
    """The API server's own message (the ``message`` of a Status body), else the error's
    first line."""
    body = getattr(error, "body", None)
    if body:
        try:
            data = json.loads(body)
        except (TypeError, ValueError):
            data = None
        if isinstance(data, dict) and data.get("message"):
            return str(data["message"])
    text = str(error).strip()
    return text.splitlines()[0] if text else "no message"


class Owners:
    """The uids of a run's workloads (Jobs and bare Pods) and which pods they own; each
    impostor is reported once (:meth:`impostor`)."""

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}
        self.pods: dict[str, str] = {}
        self._reported: set[str] = set()

    def add(self, kind: str, name: str, uid: str) -> None:
        """Record one of the run's workloads.

        Args:
            kind: ``Job`` or ``Pod``.
            name: its name.
            uid: its ``metadata.uid``.
        """
        (self.jobs if kind == "Job" else self.pods)[name] = uid

    def uid(self, name: str) -> str | None:
        """The uid of the run's workload ``name``.

        Args:
            name: the Job's or bare Pod's name.

        Returns:
            Its uid, or ``None`` when it is not one of the run's.
        """
        return self.jobs.get(name) or self.pods.get(name)

    def owns(self, pod: Any) -> bool:
        """Whether ``pod`` belongs to the run: made by one of its Jobs (controller uid), or
        one of its bare Pods itself (same uid).

        Args:
            pod: a Pod (an API object or a dict).
        """
        owner = controller_uid(pod)
        if owner is not None:
            return owner in self.jobs.values()
        return uid_of(pod) in self.pods.values()

    def impostor(self, pod: Any, namespace: str, selector: str) -> str | None:
        """The warning for a pod that matches the run's labels but is not the run's, the
        first time it is seen (``None`` after that).

        Args:
            pod: the pod (an API object or a dict).
            namespace: the run's namespace.
            selector: the run's label selector, named in the warning.
        """
        name = str(get(pod, "metadata", "name"))
        if name in self._reported:
            return None
        self._reported.add(name)
        owner = controller_uid(pod)
        made_by = f"its controller has uid {owner}" if owner else f"a bare pod, uid {uid_of(pod)}"
        return impostor_warning(namespace, name, selector, f"no workload of this run made it ({made_by})")


def impostor_warning(namespace: str, name: str, selector: str, why: str) -> str:
    """The one line a step log shows about a pod it ignores.

    Args:
        namespace: the pod's namespace.
        name: the pod's name.
        selector: the run's label selector it carries.
        why: whose it is not (``"this task did not create it"``).

    >>> impostor_warning("ml", "evil", "torchstep/app-id=a", "this task did not create it")[:53]
    'torchstep: WARNING: ignoring pod ml/evil: it carries '
    """
    return (
        f"torchstep: WARNING: ignoring pod {namespace}/{name}: it carries this run's labels ({selector}) but {why}; "
        f"its log and its result are not used. Someone allowed to create pods in namespace {namespace} made it: "
        "see docs/security.md"
    )
