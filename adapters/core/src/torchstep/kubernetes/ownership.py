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

from typing import Any

from torchstep.errors import SpecError
from torchstep.kubernetes.apiobj import controller_uid, get, uid_of

#: The key, in an orchestrator's state store, of the uids of the workloads a run created:
#: ``{workload name: uid}`` (renaming it breaks the reattach of tries in flight).
UIDS_KEY = "torchstep_workload_uids"


def recorded_uids(store: Any) -> dict[str, str]:
    """The uids recorded in ``store`` (``get``/``set`` of JSON values) by :func:`record_uid`;
    a malformed value counts as none recorded (attaching is then refused, never allowed)."""
    value = store.get(UIDS_KEY)
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(k, str) and isinstance(v, str) and v}


def record_uid(store: Any, name: str, uid: str) -> None:
    """Record that this run created the workload ``name`` with ``uid`` (call it as soon as
    the create call returned: a try that crashes later can then attach to it). Raises what
    the store raises: a run whose uid could not be recorded must not go on (it would be
    refused by its own retry)."""
    uids = recorded_uids(store)
    uids[name] = uid
    store.set(UIDS_KEY, uids)


def refusal(kind: str, namespace: str, name: str, problem: str) -> SpecError:
    """The error for an existing object a run will not use (named by ``kind ns/name``)."""
    return SpecError(
        f"{kind} {namespace}/{name}", "kubernetes", f"already exists and was not created by this run ({problem})",
        fix="delete that object, or give this step another name or namespace; torchstep never adopts or deletes "
        "objects that are not its own (who may create them in this namespace: docs/security.md)",
    )  # fmt: skip


class Owners:
    """The uids of a run's workloads (Jobs and bare Pods) and which pods they own; each
    impostor is reported once (:meth:`impostor`)."""

    def __init__(self) -> None:
        self.jobs: dict[str, str] = {}
        self.pods: dict[str, str] = {}
        self._reported: set[str] = set()

    def add(self, kind: str, name: str, uid: str) -> None:
        (self.jobs if kind == "Job" else self.pods)[name] = uid

    def uid(self, name: str) -> str | None:
        return self.jobs.get(name) or self.pods.get(name)

    def owns(self, pod: Any) -> bool:
        """Whether ``pod`` belongs to the run: made by one of its Jobs (controller uid), or
        one of its bare Pods itself (same uid)."""
        owner = controller_uid(pod)
        if owner is not None:
            return owner in self.jobs.values()
        return uid_of(pod) in self.pods.values()

    def impostor(self, pod: Any, namespace: str, selector: str) -> str | None:
        """The warning for a pod that matches the run's labels but is not the run's, the
        first time it is seen (``None`` after that)."""
        name = str(get(pod, "metadata", "name"))
        if name in self._reported:
            return None
        self._reported.add(name)
        owner = controller_uid(pod)
        made_by = f"its controller has uid {owner}" if owner else f"a bare pod, uid {uid_of(pod)}"
        return impostor_warning(namespace, name, selector, f"no workload of this run made it ({made_by})")


def impostor_warning(namespace: str, name: str, selector: str, why: str) -> str:
    """The one line a step log shows about a pod it ignores (``why``: whose it is not).

    >>> impostor_warning("ml", "evil", "torchstep/app-id=a", "this task did not create it")[:53]
    'torchstep: WARNING: ignoring pod ml/evil: it carries '
    """
    return (
        f"torchstep: WARNING: ignoring pod {namespace}/{name}: it carries this run's labels ({selector}) but {why}; "
        f"its log and its result are not used. Someone allowed to create pods in namespace {namespace} made it: "
        "see docs/security.md"
    )
