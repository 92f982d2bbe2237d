"""A run's state read from outside its watcher: what an orchestrator that waits somewhere
else (Airflow's triggerer, for a deferred task) needs to know when to hand the run back to
a :class:`~torchstep.kubernetes.JobGang`, which then collects it as usual.

After :meth:`JobGang.create <torchstep.kubernetes.JobGang.create>`, :func:`handle_of` keeps
the run as JSON (namespace, label selector, each workload's kind, name and the uid this run
created or attached to, and its preemption budget); :class:`RemoteRun` reads it back,
anywhere, with any :class:`~torchstep.kubernetes.client.KubernetesClient`. Each
:meth:`RemoteRun.look` is one round of reads (each workload's status, the run's own pods)
and decides as the watcher does: a Job ``Complete`` / ``SuccessCriteriaMet`` succeeded, a
``Failed`` / ``FailureTarget`` one failed, a bare Pod by its phase; a pod with the
``DisruptionTarget`` condition and a Kueue eviction each count against
``preemption_retries`` (:class:`~torchstep.kubernetes.preemption.Preemptions`): one more
than it allows is ``PREEMPTED``. Only the run's own objects count: a workload whose uid is
not the recorded one, or a pod none of them made, is ignored.

The states a look returns besides the watcher's (RUNNING, SUCCEEDED, FAILED, PREEMPTED):
:data:`GONE` (a workload was deleted, or replaced by one with another uid: nothing left to
wait for) and :data:`BARE_POD` (a bare Pod was preempted: nothing in Kubernetes replaces
it; the watcher must create it again).

Example::

    handle = handle_of(gang)                       # in the worker, after gang.create()
    run = RemoteRun(handle, OfficialClient.from_config())
    run.look()["state"]                            # in the triggerer, every poll
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchstep.errors import SpecError
from torchstep.kubernetes.apiobj import get, http_status, uid_of
from torchstep.kubernetes.ownership import Owners
from torchstep.kubernetes.preemption import Preemptions
from torchstep.kubernetes.runobjects import BARE_POD, deletions, job_state, pod_state, verdict
from torchstep.result import RUNNING

if TYPE_CHECKING:
    from torchstep.kubernetes.client import KubernetesClient
    from torchstep.kubernetes.jobs import JobGang

__all__ = ["BARE_POD", "GONE", "RemoteRun", "handle_of"]

#: A workload of the run is gone (deleted, or replaced by another object of its name).
GONE = "GONE"
#: The keys of a handle (:func:`handle_of`), all JSON values.
HANDLE_KEYS = ("namespace", "app_id", "label_selector", "workloads", "preemption_retries", "queue")


def handle_of(gang: JobGang) -> dict[str, Any]:
    """The JSON handle of a run whose workloads exist (after ``gang.create()``).

    Args:
        gang: the run's :class:`~torchstep.kubernetes.JobGang`, created or attached.

    Returns:
        ``{"namespace", "app_id", "label_selector", "workloads": [{"kind", "name", "uid"}],
        "preemption_retries", "queue"}``.

    Raises:
        SpecError: a workload of the run has no uid yet (``create()`` was not called).
    """
    workloads = []
    for role in gang.rendered.roles:
        uid = gang.owners.uid(role.name)
        if uid is None:
            raise SpecError(
                "gang", "kubernetes", f"{role.kind} {role.name} has no uid yet", fix="call gang.create() first"
            )
        workloads.append({"kind": role.kind, "name": role.name, "uid": uid})
    options = gang.rendered.options
    return {
        "namespace": gang.rendered.namespace,
        "app_id": gang.rendered.app_id,
        "label_selector": gang.rendered.label_selector,
        "workloads": workloads,
        "preemption_retries": int(options.preemption_retries),
        "queue": options.queue,
    }


class RemoteRun:
    """One run read through its handle (see the module docstring). Not thread-safe: one
    caller polls it.

    Args:
        handle: what :func:`handle_of` returned (JSON, possibly after a round trip).
        client: the Kubernetes client.
        say: receives each line the watcher would write into the step log (queued,
            admitted, preempted); ``None``: dropped.

    Raises:
        SpecError: the handle lacks a key or a workload lacks its kind, name or uid.
    """

    def __init__(
        self, handle: Mapping[str, Any], client: KubernetesClient, say: Callable[[str], None] | None = None
    ) -> None:
        missing = [k for k in HANDLE_KEYS if k not in handle]
        bad = [w for w in handle.get("workloads") or [] if not all(w.get(k) for k in ("kind", "name", "uid"))]
        if missing or bad or not handle.get("workloads"):
            raise SpecError(
                "handle",
                "kubernetes",
                f"not a run handle (missing {missing or 'workloads'})",
                fix="pass what torchstep.kubernetes.remote.handle_of returned",
            )
        self.handle = dict(handle)
        self.client = client
        self.ns = str(handle["namespace"])
        self.owners = Owners()
        for w in handle["workloads"]:
            self.owners.add(w["kind"], w["name"], w["uid"])
        self.preemptions = Preemptions(int(handle["preemption_retries"]), handle.get("queue"), say or _drop)

    def look(self) -> dict[str, Any]:
        """One round of reads; what the run is now.

        Returns:
            ``{"state": RUNNING | SUCCEEDED | FAILED | PREEMPTED | GONE | BARE_POD,
            "workload": the workload that decided it (or None), "preempted_pods": {uid: pod
            name} (every disrupted pod counted so far), "evictions": n}``.

        Raises:
            Exception: the client's error for a read that failed other than with 404 (the
                caller decides whether it is transient: ``torchstep.kubernetes.retry.transient``).
        """
        states: list[str | None] = []
        kinds: dict[str, str] = {}
        for w in self.handle["workloads"]:
            kind, name = w["kind"], w["name"]
            kinds[name] = kind
            read = self.client.read_namespaced_job_status if kind == "Job" else self.client.read_namespaced_pod_status
            try:
                obj = read(name, self.ns)
            except Exception as e:
                if http_status(e) == 404:
                    return self._said(GONE, name)
                raise
            if uid_of(obj) != w["uid"]:  # someone else's object under the run's name
                return self._said(GONE, name)
            states.append(_job_state(obj, name, self.preemptions) if kind == "Job" else pod_state(obj))
        listed = self.client.list_namespaced_pod(self.ns, label_selector=self.handle["label_selector"])
        self.preemptions.observe_pods([p for p in get(listed, "items") or [] if self.owners.owns(p)], kinds)
        decided = verdict(states, self.preemptions)
        return self._said(decided or RUNNING, self.preemptions.bare_pod if decided == BARE_POD else None)

    def delete(self) -> None:
        """Delete every object of the run by its label selector (Jobs and Pods with
        foreground propagation, then Services and NetworkPolicies): what the watcher's cleanup does. Each kind
        is attempted even when another fails.

        Raises:
            RuntimeError: naming every kind whose deletion failed.
        """
        sel, failed = self.handle["label_selector"], []
        calls = deletions(self.client, self.ns, sel)
        for what, call in calls:
            try:
                call()
            except Exception as e:
                failed.append(f"{what}: {e}")
        if failed:
            raise RuntimeError(f"deleting the objects of {self.handle['app_id']} ({sel}): " + "; ".join(failed))

    def _said(self, state: str, workload: str | None) -> dict[str, Any]:
        return {
            "state": state,
            "workload": workload,
            "preempted_pods": dict(self.preemptions.pods),
            "evictions": self.preemptions.evictions,
        }


def _job_state(job: Any, name: str, preemptions: Preemptions) -> str | None:
    """A Job's state as :class:`~torchstep.kubernetes.JobGang` reads it (its conditions)."""
    preemptions.observe_job(name, job)
    return job_state(job)


def _drop(text: str) -> None:
    """Discard a log line."""
