"""``JobGang``: the lifecycle of a rendered app on a cluster, for every adapter.

One :class:`JobGang` is one logical attempt's gang of Jobs (or bare Pods) and their headless
Services. It is torchstep's own class, not the Kubernetes JobSet API (``jobset.x-k8s.io``).

Create the objects of :func:`torchstep.kubernetes.render_app` (each role's Job or Pod, and
its headless Service owned by it), wait for the workloads, follow every pod's log as lines
to a callback (the pods of replaced replicas too; a dropped stream is reattached without
repeating or losing a line), collect the step result from the pods (each agent writes its
result summary as the container's termination message; one
:class:`~torchstep.result.StepResult` through :func:`torchstep.result.merge`), cancel, and
delete everything with foreground propagation on every exit path.

Creating is *attach or create*: every object name is derived from the run id (the
orchestrator's identity of the logical attempt), so a watcher that died and is run again
finds its own Job (HTTP 409 and our labels) and attaches to it instead of starting a second
gang of pods; its log followers continue after the cursor the first watcher saved (on the
workload as the :data:`CURSOR_ANNOTATION` annotation, and in ``cursor_store`` when given).
An object of that name without our labels is someone else's: a :class:`SpecError` naming it.

Ownership is decided by uid (:mod:`torchstep.kubernetes.ownership`): only pods that the
run's own Jobs made (``ownerReferences``), or its own bare Pods, are followed and collected;
another pod carrying the run's labels is ignored and reported once in the step log (through
``on_line``). Given a ``cursor_store`` (the orchestrator's state between tries), every
created workload's uid is recorded there at once, and attaching requires it: an object with
our labels and another uid is refused by name and left alone, like one without our labels.

The Kubernetes client is injected (:class:`~torchstep.kubernetes.client.KubernetesClient`),
so Airflow's hook, a KFP launcher pod's in-cluster config or a Prefect worker's kubeconfig
all drive the same code.

The run's pods and Jobs are followed through the watch API (:mod:`torchstep.kubernetes.watch`):
every change is an event, so a pod evicted and deleted between two reads is still counted
as a preemption; a client without ``watch`` is read every ``poll_interval`` instead.

Example::

    rendered = torchstep.kubernetes.render_app(app, namespace="ml", cfg={"run_id": run_id})
    jobs = JobGang(rendered, OfficialClient.from_config(), on_line=print)
    result = jobs.run()          # blocks; jobs.cancel() from another thread stops it
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

from torchstep.errors import RunError, SpecError
from torchstep.kubernetes.apiobj import began, get, http_status, uid_of
from torchstep.kubernetes.client import KubernetesClient
from torchstep.kubernetes.collect import collect
from torchstep.kubernetes.logcursor import Cursor, cursor_value, lines_of
from torchstep.kubernetes.ownership import Owners, record_uid, recorded_uids, refusal, refused_creation
from torchstep.kubernetes.pod import CONTAINER_NAME
from torchstep.kubernetes.preemption import Preemptions
from torchstep.kubernetes.render import LABEL_APP_ID, LABEL_MANAGED_BY, RenderedApp, owned_by
from torchstep.kubernetes.retry import (
    API_RETRY_BUDGET_S,
    DELETE_RETRY_BUDGET_S,
    ApiRetriesExhausted,
    Interrupted,
    call_api,
    transient,
)
from torchstep.kubernetes.runobjects import BARE_POD, deletions, job_state, pod_state, verdict, wait_until_gone
from torchstep.kubernetes.watch import Watcher, WatchingClient
from torchstep.result import CANCELLED, FAILED, PREEMPTED, RUNNING, SUCCEEDED, StepResult

#: What happens to the objects when the run ends: always deleted, deleted only after
#: success (failed pods stay for inspection), or kept.
ON_FINISH = ("delete", "delete_succeeded", "keep")
#: How often a dropped log stream of a running pod is reattached before giving up on it.
MAX_REATTACH = 100
#: Reads again, once the run has ended, of a finished pod's log that failed to read (0.2 s apart).
STOP_REREADS = 5
#: Seconds added to a log stream's ``since_seconds`` (the time since the last line seen,
#: measured on the watcher's clock but applied by the node's): clocks that differ by less
#: than this re-read a little; by more, the gap is seen and the whole log read again.
SINCE_MARGIN_S = 10
#: Annotation on the first role's workload: where the watcher's log followers are
#: (``{"pods": {pod: [timestamp, lines at that timestamp]}}``), for a watcher that reattaches.
CURSOR_ANNOTATION = "torchstep/log-cursor"
#: The key of that cursor in a ``cursor_store`` (Airflow's task state store, for one).
CURSOR_KEY = "torchstep_log_cursor"
log = logging.getLogger("torchstep.kubernetes")

LineCallback = Callable[[str], None]


class CursorStore(Protocol):
    """Where a watcher keeps its state across crashes (``get``/``set`` of JSON values:
    Airflow's ``task_state_store`` is one): its log position, and the uids of the
    workloads its run created (:data:`torchstep.kubernetes.ownership.UIDS_KEY`)."""

    def get(self, key: str) -> Any:
        """The value saved under ``key``.

        Args:
            key: the value's name.

        Returns:
            The JSON value, or ``None`` when nothing was saved.
        """
        ...

    def set(self, key: str, value: Any) -> Any:
        """Save ``value`` under ``key``, replacing what was there.

        Args:
            key: the value's name.
            value: a JSON value.

        Returns:
            Anything; it is ignored.
        """
        ...


class JobGang:
    """Every object of one run of a rendered app (see the module docstring).

    ``on_line(text)`` receives every line of every pod's main container (the agent already
    prefixes ``[role/rank]``), and the warning about any impostor pod; ``on_finish`` is one
    of :data:`ON_FINISH`; ``poll_interval`` the seconds between status reads of a client
    that cannot watch (the official client watches: :mod:`torchstep.kubernetes.watch`);
    ``cursor_store`` (optional: the orchestrator's state between tries) keeps the log
    position too, saved at most every ``cursor_interval`` seconds and when the run ends, and
    the uid of every workload this run creates, recorded as soon as it exists; with it,
    attaching requires that uid. After :meth:`create`, ``attached`` says whether this run
    found its workloads running (or finished) instead of creating them, and ``owners`` holds
    the uids of its workloads.

    Args:
        rendered: the rendering of one run (:func:`~torchstep.kubernetes.render_plan`).
        client: the Kubernetes client (:class:`~torchstep.kubernetes.OfficialClient`, or a fake).
        on_line: called with every log line; ``None``: print it to stdout.
        poll_interval: seconds between status reads, for a client without ``watch``.
        on_finish: ``delete`` every object, ``delete_succeeded`` (keep a failed run's for
            debugging) or ``keep``.
        logger: where progress and warnings go; ``None``: this module's logger.
        cursor_store: the orchestrator's state between tries (log position, workload uids);
            ``None``: attach by labels only, follow logs from the start.
        cursor_interval: the most seconds between two saves of the log position.

    ``api_retry_budget_s`` (attribute, default :data:`~torchstep.kubernetes.retry.API_RETRY_BUDGET_S`):
    the most seconds one API call keeps being retried after transient errors (429, 5xx, a
    dropped connection: :mod:`torchstep.kubernetes.retry`) before the run fails.

    Raises:
        SpecError: ``on_finish`` is not one of :data:`ON_FINISH`.
    """

    def __init__(
        self,
        rendered: RenderedApp,
        client: KubernetesClient,
        *,
        on_line: LineCallback | None = None,
        poll_interval: float = 2.0,
        on_finish: str = "delete",
        logger: logging.Logger | Any = None,
        cursor_store: CursorStore | None = None,
        cursor_interval: float = 5.0,
    ) -> None:
        if on_finish not in ON_FINISH:
            raise SpecError("on_finish", "kubernetes", f"unknown {on_finish!r}", fix=f"one of {', '.join(ON_FINISH)}")
        self.rendered = rendered
        self.client = client
        self.ns = rendered.namespace
        self.on_line = on_line or _print_line
        self.poll = float(poll_interval)
        self.on_finish = on_finish
        self.log = logger or log
        self.result: StepResult | None = None
        self._cancel = threading.Event()
        self._stop_logs = threading.Event()
        self._followed: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._emit_lock = threading.Lock()
        self.attached = False
        self.cursor_store = cursor_store
        self.cursor_interval = float(cursor_interval)
        self._cursors: dict[str, Cursor] = {}
        self._resume: dict[str, tuple[str, int]] = {}
        self._saved: dict[str, tuple[str, int]] = {}
        self._saved_at = 0.0
        self._began: float | None = None  # when an attached workload started on the cluster
        self.owners = Owners()
        self._created: list[tuple[str, str]] = []  # (kind, name) of what this object created
        self._refused = False  # an existing object was refused: delete only what was created here
        self.api_retry_budget_s = API_RETRY_BUDGET_S
        #: The run's preemptions against its own budget (:mod:`torchstep.kubernetes.preemption`).
        self.preemptions = Preemptions(rendered.options.preemption_retries, rendered.options.queue, self._say)
        #: The watchers of the run's Pods and Jobs while :meth:`wait` runs (a watching client).
        self.watchers: list[Watcher] = []
        self._changed = threading.Event()  # a watch event arrived (or a cancel)
        self._watch_lock = threading.Lock()  # the state the watch events build
        self._seen: dict[str, Any] = {}  # workload name -> its latest Job or bare Pod
        self._gone: set[str] = set()  # workloads whose DELETED event came
        self._former: set[str] = set()  # uids of replaced bare Pods: their late events are ignored
        self._kinds = {r.name: r.kind for r in rendered.roles}  # workload name -> Job | Pod
        self._follow_lock = threading.Lock()  # the watch threads and this one start followers

    def _api(self, what: str, fn: Callable[[], Any], *, stop: threading.Event | None = None, **kw: Any) -> Any:
        """``fn()`` retried after transient API errors (:func:`~torchstep.kubernetes.retry.call_api`)."""
        kw.setdefault("budget_s", self.api_retry_budget_s)
        return call_api(what, fn, stop=stop, logger=self.log, **kw)

    # -- lifecycle ----------------------------------------------------------------------------
    def run(self) -> StepResult:
        """Create, wait, collect, clean up; returns (and keeps in ``result``) the step result.
        Whatever interrupts it (a cancel, an API error, the caller's timeout or signal)
        deletes every object before it propagates.

        Returns:
            The step result (CANCELLED after :meth:`cancel`).

        Raises:
            SpecError: an existing workload with this run's name is not this run's.
            RunError: the API server refused to create a workload.
        """
        started = time.time()
        try:
            self.create()
            state = self.wait()
            # attached: the run began when the first watcher created it, not now
            self.result = self.collect(state, min(started, self._began or started))
            if state in (CANCELLED, PREEMPTED):
                self.delete()  # a cancelled run never keeps pods running, whatever on_finish says
        except BaseException:
            self.delete()  # nothing may keep running
            self._finish_logs()
            raise
        self._finish_logs()  # the last lines of finished pods, before they may be deleted
        self.save_cursor(force=True)
        if state != CANCELLED and (
            self.on_finish == "delete" or (self.on_finish == "delete_succeeded" and self.result.succeeded)
        ):
            self.delete()
        return self.result

    def cancel(self) -> None:
        """Stop the run (from any thread): ``run`` deletes everything and returns CANCELLED."""
        self._cancel.set()
        self._changed.set()

    def create(self) -> None:
        """Attach or create each role's workload, then its Service owned by it (deleted
        with it). A workload that already exists with this run's labels (and, given a
        ``cursor_store``, the uid recorded there) is attached to (see the module docstring);
        any other stops the run with a :class:`SpecError` and is left alone. A creation the
        API server refuses (any answer but 409) stops it with a :class:`RunError` (the HTTP
        status, the server's message and the fix).

        Raises:
            SpecError: an existing workload is not this run's (it is left alone).
            RunError: the API server refused a creation.
        """
        for role in self.rendered.roles:
            body = dict(role.workload)
            kind, name = body["kind"], body["metadata"]["name"]
            make = self.client.create_namespaced_job if kind == "Job" else self.client.create_namespaced_pod
            try:  # retried on 429 only (answered before anything is done): a create is not idempotent
                created = self._api(
                    f"create {kind} {self.ns}/{name}",
                    partial(make, self.ns, body=body),
                    statuses={429},
                    connection=False,
                )
            except Exception as e:
                error = e.error if isinstance(e, ApiRetriesExhausted) else e
                if http_status(error) != 409:
                    raise refused_creation(kind, self.ns, name, error) from e
                created = self._read_ours(kind, name)
                self.owners.add(kind, name, self._attachable_uid(kind, name, created))
                self.attached = True
                self._resume_from(created)
                start = began(created)
                if start is not None:
                    self._began = start if self._began is None else min(self._began, start)
                self.log.info(
                    "torchstep: attached to the running %s %s/%s (created earlier for this run)", kind, self.ns, name
                )
            else:
                self._created.append((kind, name))
                self._own(kind, name, created)
                self.log.info("torchstep: created %s %s/%s", kind, self.ns, name)
            if role.service is not None:
                service = owned_by(role.service, self.client.sanitize(created))
                svc_name = service["metadata"]["name"]
                try:
                    self._api(
                        f"create Service {self.ns}/{svc_name}",
                        partial(self.client.create_namespaced_service, self.ns, body=service),
                        statuses={429},
                        connection=False,
                    )
                except Exception as e:
                    error = e.error if isinstance(e, ApiRetriesExhausted) else e
                    if http_status(error) != 409:
                        raise refused_creation("Service", self.ns, svc_name, error) from e
                    self._check_service(service["metadata"]["name"], kind, name)
            if role.network_policy is not None:
                self._create_network_policy(owned_by(role.network_policy, self.client.sanitize(created)))
        if self.attached and self.cursor_store is not None:
            self._resume_merge(cursor_value(self._store_get()))

    def _create_network_policy(self, policy: dict[str, Any]) -> None:
        """Create a role's NetworkPolicy, owned by its Job (deleted with it): only the run's
        own pods reach its stores. A refusal stops the run (the stores would be open to every
        pod of the cluster); 409 is this run's own, created before a reattach."""
        name = policy["metadata"]["name"]
        create = getattr(self.client, "create_namespaced_network_policy", None)
        if create is None:  # a client written before NetworkPolicies: say so, every run
            self.log.warning(
                "torchstep: NetworkPolicy %s/%s not created: this Kubernetes client has no "
                "create_namespaced_network_policy; the rendezvous store is open to every pod",
                self.ns,
                name,
            )
            return
        try:
            self._api(
                f"create NetworkPolicy {self.ns}/{name}",
                partial(create, self.ns, body=policy),
                statuses={429},
                connection=False,
            )
        except Exception as e:
            error = e.error if isinstance(e, ApiRetriesExhausted) else e
            if http_status(error) != 409:
                raise refused_creation("NetworkPolicy", self.ns, name, error) from e

    def _own(self, kind: str, name: str, created: Any) -> None:
        """Keep the uid of a workload this run just created, and record it in the store
        before anything else happens (a failure to record stops the run: everything it
        created is deleted, as on any error)."""
        uid = uid_of(created)
        if uid is None:
            raise RunError(
                f"{kind} {self.ns}/{name}",
                "the API server answered its creation without a uid; fix: "
                "check the Kubernetes API server (every object it creates has one)",
            )
        self.owners.add(kind, name, uid)
        if self.cursor_store is not None:
            record_uid(self.cursor_store, name, uid)

    def _attachable_uid(self, kind: str, name: str, existing: Any) -> str:
        """The uid of an existing workload with our labels, when this run may attach to it:
        with a store, only the uid recorded there when this run created it."""
        uid = uid_of(existing)
        if self.cursor_store is None:
            if uid is None:
                raise RunError(
                    f"{kind} {self.ns}/{name}",
                    "the API server answered it without a uid; fix: check the "
                    "Kubernetes API server (every object it keeps has one)",
                )
            return uid
        recorded = recorded_uids(self.cursor_store).get(name)
        if uid is None or uid != recorded:
            self._refused = True
            raise refusal(
                kind,
                self.ns,
                name,
                f"it carries this run's labels but has uid {uid}, and this task recorded "
                + (f"uid {recorded} when it created it" if recorded else "no creation of it"),
            )
        return uid

    def state(self) -> str | None:
        """The run's state on the cluster without changing anything: ``None`` when none of
        its workloads exists (never created, or deleted), ``FAILED`` when one failed,
        ``SUCCEEDED`` when all did, else ``RUNNING`` (some may still be missing: ``run``
        attaches to what exists and creates the rest)."""
        states: list[str | None] = []
        found = False
        for r in self.rendered.roles:
            try:
                states.append(self._workload_state(r.kind, r.name))
                found = True
            except Exception as e:
                if http_status(e) != 404:
                    raise
                states.append(None)
        if not found:
            return None
        if FAILED in states:
            return FAILED
        if all(s == SUCCEEDED for s in states):
            return SUCCEEDED
        return RUNNING

    def _read_ours(self, kind: str, name: str) -> Any:
        """The existing workload ``name``, checked to carry this run's labels."""
        read = self.client.read_namespaced_job_status if kind == "Job" else self.client.read_namespaced_pod_status
        obj = self._api(f"read {kind} {self.ns}/{name}", lambda: read(name, self.ns))
        self._check_ours(kind, name, get(obj, "metadata", "labels") or {})
        return obj

    def _check_ours(self, kind: str, name: str, labels: Any) -> None:
        labels = dict(labels or {})
        if labels.get(LABEL_APP_ID) == self.rendered.app_id and labels.get(LABEL_MANAGED_BY) == "torchstep":
            return
        self._refused = True
        raise refusal(
            kind,
            self.ns,
            name,
            f"labels {LABEL_APP_ID}={labels.get(LABEL_APP_ID)!r}, {LABEL_MANAGED_BY}="
            f"{labels.get(LABEL_MANAGED_BY)!r}; expected {self.rendered.app_id!r}, 'torchstep'",
        )

    def _check_service(self, name: str, owner_kind: str, owner: str) -> None:
        """An existing Service of a role's name is used only when it carries our labels
        and is owned by the role's workload (by uid): another one could point the
        rendezvous somewhere else."""
        sel = self.rendered.label_selector
        listed = self._api(
            f"list Services {self.ns} ({sel})", lambda: self.client.list_namespaced_service(self.ns, label_selector=sel)
        )
        found = [svc for svc in get(listed, "items") or [] if get(svc, "metadata", "name") == name]
        self._check_ours("Service", name, get(found[0], "metadata", "labels") if found else {})
        uid = self.owners.uid(owner)
        refs = get(found[0], "metadata", "owner_references") or []
        if not any(get(r, "uid") == uid for r in refs):
            self._refused = True
            raise refusal(
                "Service",
                self.ns,
                name,
                f"it carries this run's labels but is not owned by {owner_kind} {owner} (uid {uid})",
            )

    def wait(self) -> str:
        """Follow the run until every workload finished, one failed, or a cancel; the step's
        state. A client that can watch is followed by events (:mod:`torchstep.kubernetes.watch`),
        any other is read every ``poll_interval``. Transient API errors are retried
        (:mod:`torchstep.kubernetes.retry`); a cancel while waiting to retry returns CANCELLED.
        A Job suspended for Kueue is waited for (no deadline of the watcher's own runs
        meanwhile); preemptions beyond the run's ``preemption_retries`` end it PREEMPTED
        (:mod:`torchstep.kubernetes.preemption`).

        Returns:
            ``SUCCEEDED``, ``FAILED``, ``CANCELLED`` or ``PREEMPTED``.
        """
        if isinstance(self.client, WatchingClient):
            return self._wait_watching(self.client)
        return self._wait_polling()

    def _wait_watching(self, client: WatchingClient) -> str:
        sel = self.rendered.label_selector
        kinds = {r.name: r.kind for r in self.rendered.roles}

        def lister(kind: str) -> Callable[[threading.Event], Any]:
            fn = self.client.list_namespaced_pod if kind == "Pod" else client.list_namespaced_job
            return lambda stop: self._api(
                f"list {kind}s {self.ns} ({sel})", lambda: fn(self.ns, label_selector=sel), stop=stop
            )

        watched = ["Pod"] + (["Job"] if "Job" in kinds.values() else [])
        self.watchers = [
            Watcher(
                kind,
                client,
                self.ns,
                sel,
                list_objects=lister(kind),
                on_list=partial(self._listed, kind),
                on_event=partial(self._watched, kind),
                budget_s=self.api_retry_budget_s,
                logger=self.log,
            )
            for kind in watched
        ]
        for w in self.watchers:
            w.start()
        try:
            while True:
                if self._cancel.is_set():
                    return CANCELLED
                for w in self.watchers:
                    if w.error is not None:
                        raise w.error
                self._changed.clear()  # an event from now on wakes the wait below
                with self._watch_lock:
                    states = [self._watched_state(r.name) for r in self.rendered.roles]
                for i, r in enumerate(self.rendered.roles):
                    if states[i] == "gone":  # deleted by someone else: read it (404 ends the run, as ever)
                        states[i] = self._workload_state(r.kind, r.name, self._cancel)
                decided = verdict(states, self.preemptions)
                if decided == BARE_POD:
                    self._replace_bare_pod(self.preemptions.bare_pod or "")
                    continue
                if decided is not None:
                    return decided
                self.save_cursor()
                self._changed.wait(self.cursor_interval)
        except Interrupted:
            return CANCELLED
        finally:
            for w in self.watchers:
                w.stop()

    def _watched_state(self, name: str) -> str | None:
        """A workload's state from its latest event: ``None`` while it runs (or is not seen
        yet), ``"gone"`` once deleted (the caller reads it); under the watch lock."""
        if self.preemptions.bare_pod == name:
            return None
        if name in self._gone:
            return "gone"
        obj = self._seen.get(name)
        if obj is None:
            return None
        if self._kinds.get(name) == "Pod":
            return pod_state(obj)
        return job_state(obj)

    def _listed(self, kind: str, items: Any) -> None:
        """A list of the run's Pods or Jobs (a watcher's first, or after 410 Gone): each is
        seen as modified, and what the cache held that is not there any more as deleted."""
        with self._watch_lock:
            listed = {str(get(o, "metadata", "name")) for o in items}
            for obj in items:
                self._observe(kind, "MODIFIED", obj)
            for name, obj in list(self._seen.items()):
                if self._kinds.get(name) == kind and name not in listed:
                    self._observe(kind, "DELETED", obj)
        self._changed.set()

    def _watched(self, kind: str, change: str, obj: Any) -> None:
        """One watch event of the run's Pods or Jobs."""
        with self._watch_lock:
            self._observe(kind, change, obj)
        self._changed.set()

    def _observe(self, kind: str, change: str, obj: Any) -> None:
        """Feed one object as an event saw it to the state: workload states, preemptions
        (a pod's ``DELETED`` event carries its last conditions), new pods to follow."""
        name = str(get(obj, "metadata", "name"))
        uid = uid_of(obj)
        if kind == "Job":
            if uid is None or uid != self.owners.jobs.get(name):
                return  # not one of this run's Jobs
            if change == "DELETED":
                self._gone.add(name)
                self._seen.pop(name, None)
                return
            self._seen[name] = obj
            self.preemptions.observe_job(name, obj)
            return
        if uid in self._former:
            return
        if not self.owners.owns(obj):
            warning = self.owners.impostor(obj, self.ns, self.rendered.label_selector) if change != "DELETED" else None
            if warning is not None:
                self.log.warning("%s", warning)
                self._say(warning)
            return
        self.preemptions.observe_pods([obj], self._kinds)
        if self.owners.pods.get(name) == uid:  # a bare Pod: the workload itself
            if change == "DELETED":
                self._gone.add(name)
                self._seen.pop(name, None)
            else:
                self._seen[name] = obj
        if change != "DELETED":
            self._follow_pod(obj)

    def _wait_polling(self) -> str:
        kinds = {r.name: r.kind for r in self.rendered.roles}
        while True:
            if self._cancel.is_set():
                return CANCELLED
            try:
                states = [self._workload_state(r.kind, r.name, self._cancel) for r in self.rendered.roles]
                self.preemptions.observe_pods(self._follow_new_pods(self._cancel), kinds)
            except Interrupted:
                return CANCELLED
            decided = verdict(states, self.preemptions)
            if decided == BARE_POD:
                try:
                    self._replace_bare_pod(self.preemptions.bare_pod or "")
                except Interrupted:
                    return CANCELLED
                continue
            if decided is not None:
                return decided
            self.save_cursor()
            self._cancel.wait(self.poll)

    def _replace_bare_pod(self, name: str) -> None:
        """Run a preempted bare Pod again (nothing else replaces one): once the old pod is
        gone, the same Pod is created under the same name; its uid becomes the run's, its
        log is followed from where the old one's ended. Counted by :attr:`preemptions`."""
        role = next(r for r in self.rendered.roles if r.name == name)
        sel = self.rendered.label_selector
        with self._watch_lock:  # the old pod's late events are not the new one's
            self._former.add(self.owners.uid(name) or "")
        self._api(
            f"delete Pod {self.ns}/{name}",
            lambda: self.client.delete_collection_namespaced_pod(
                self.ns, label_selector=sel, field_selector=f"metadata.name={name}"
            ),
            stop=self._cancel,
        )
        wait_until_gone(
            lambda: self._api(
                f"read Pod {self.ns}/{name}",
                lambda: self.client.read_namespaced_pod_status(name, self.ns),
                stop=self._cancel,
            ),
            f"Pod {self.ns}/{name}",
            float(role.workload["spec"].get("terminationGracePeriodSeconds", 30)),
            lambda s: self._cancel.wait(min(self.poll, s)),
        )
        for t in list(self._threads):  # the old pod's log follower reads its last lines first
            if t.name == f"log-{name}":
                t.join(timeout=10.0)
        with self._follow_lock:
            self._followed.discard(name)
        body = dict(role.workload)
        created = self._api(
            f"create Pod {self.ns}/{name}",
            partial(self.client.create_namespaced_pod, self.ns, body=body),
            statuses={429},
            connection=False,
            stop=self._cancel,
        )
        with self._watch_lock:
            self._own("Pod", name, created)
            self._gone.discard(name)
            self._seen.pop(name, None)
        self.preemptions.replaced()
        self._say(f"torchstep: pod {name} created again after its preemption")

    def _workload_state(self, kind: str, name: str, stop: threading.Event | None = None) -> str | None:
        if kind == "Job":
            job = self._api(
                f"read Job {self.ns}/{name}", lambda: self.client.read_namespaced_job_status(name, self.ns), stop=stop
            )
            self.preemptions.observe_job(name, job)
            return job_state(job)
        try:
            pod = self._api(
                f"read Pod {self.ns}/{name}", lambda: self.client.read_namespaced_pod_status(name, self.ns), stop=stop
            )
        except Exception as e:
            error = e.error if isinstance(e, ApiRetriesExhausted) else e
            if http_status(error) == 404 and self.preemptions.bare_pod == name:
                return None  # a preempted bare Pod already gone: the watcher creates it again
            raise
        # its disruption is seen here first: the pod may be gone by the time the pods are listed
        self.preemptions.observe_pods([pod], {name: "Pod"})
        if self.preemptions.bare_pod == name:
            return None
        return pod_state(pod)

    # -- logs ---------------------------------------------------------------------------------
    def _pods(self, stop: threading.Event | None = None) -> list[Any]:
        """The run's own pods (see the module docstring); an impostor is reported once."""
        sel = self.rendered.label_selector
        ours = []
        listed = self._api(
            f"list Pods {self.ns} ({sel})",
            lambda: self.client.list_namespaced_pod(self.ns, label_selector=sel),
            stop=stop,
        )
        for pod in get(listed, "items") or []:
            if self.owners.owns(pod):
                ours.append(pod)
                continue
            warning = self.owners.impostor(pod, self.ns, sel)
            if warning is not None:
                self.log.warning("%s", warning)
                self._say(warning)
        return ours

    def _say(self, text: str) -> None:
        """A line of torchstep's own in the step log (``on_line``)."""
        with self._emit_lock:
            try:
                self.on_line(text)
            except Exception as e:
                self.log.warning("torchstep: on_line raised %s: %s", type(e).__name__, e)

    def _follow_new_pods(self, stop: threading.Event | None = None) -> list[Any]:
        """Follow the log of every pod of the run not followed yet; the run's pods as listed."""
        pods = self._pods(stop)
        for pod in pods:
            self._follow_pod(pod)
        return pods

    def _follow_pod(self, pod: Any) -> None:
        """Follow the log of one of the run's pods once it started, if not followed yet."""
        name = str(get(pod, "metadata", "name"))
        with self._follow_lock:
            if name in self._followed or get(pod, "status", "phase") not in ("Running", "Succeeded", "Failed"):
                return
            self._followed.add(name)
            t = threading.Thread(target=self._follow, args=(name,), name=f"log-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _follow(self, name: str) -> None:
        """Stream one pod's log to ``on_line``; reattach after a dropped stream (the
        timestamps of the lines already seen tell where to continue)."""
        with self._emit_lock:
            cursor = self._cursors.setdefault(name, Cursor.resumed(self._resume.get(name)))
        rereads = 0
        for attempt in range(MAX_REATTACH + 1):
            if attempt:
                cursor.reattach()
            terminal = self._pod_finished(name)
            failed = False
            try:
                since = None
                if cursor.epoch is not None:  # measured on this clock, applied on the node's: a margin
                    since = max(1, int(time.time() - cursor.epoch) + SINCE_MARGIN_S)
                if not self._stream(name, cursor, terminal, since):
                    # the window began after the last line seen (this clock is behind the node's
                    # by more than the margin): read the whole log, the cursor skips what was seen
                    self._stream(name, cursor, terminal, None)
            except Exception as e:  # a log stream must never fail the step
                self.log.warning("torchstep: log stream of pod %s dropped: %s", name, e)
                failed = transient(e)  # a finished pod's log that failed to read is read again
            if terminal and not failed:
                return
            stopping = self._stop_logs.is_set()
            if stopping and not (terminal and failed):
                return  # stopping: only a finished pod's log that failed to read is read again
            if stopping:
                rereads += 1
                if rereads > STOP_REREADS:
                    break
                time.sleep(0.2)
            elif attempt:  # a stream that ends at once again and again must not spin
                self._stop_logs.wait(min(self.poll, 1.0))
        self.log.warning("torchstep: gave up following pod %s after %d reattachments", name, attempt)

    def _stream(self, name: str, cursor: Cursor, terminal: bool, since: int | None) -> bool:
        """Deliver one log stream of pod ``name``; ``False`` (nothing delivered) when it was
        read ``since`` seconds back and may have missed lines: its first line is newer than
        the cursor, or a finished pod's window is empty (a right window holds the last line
        seen; a follow stream that ends empty is simply read again)."""
        kwargs: dict[str, Any] = {"container": CONTAINER_NAME, "timestamps": True, "_preload_content": False}
        if not terminal:
            kwargs["follow"] = True
        if since is not None:
            kwargs["since_seconds"] = since
        stream = self.client.read_namespaced_pod_log(name, self.ns, **kwargs)
        first = True
        try:
            for raw in lines_of(stream.stream()):
                if first and since is not None and cursor.is_after(raw.decode("utf-8", "replace")):
                    return False
                first = False
                self._emit(cursor, raw)
            return not (first and since is not None and terminal)
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()

    def _pod_finished(self, name: str) -> bool:
        """Whether the pod ended (or is gone): its log is then complete and read once more."""
        try:  # a transient error is retried: taken for the pod's end, it would stop following a running pod
            pod = self._api(
                f"read Pod {self.ns}/{name}",
                lambda: self.client.read_namespaced_pod_status(name, self.ns),
                stop=self._stop_logs,
            )
            phase = get(pod, "status", "phase")
        except Exception:
            return True
        return phase in ("Succeeded", "Failed", None)

    def _emit(self, cursor: Cursor, raw: bytes) -> None:
        # accept and deliver under one lock: a saved cursor never runs ahead of the lines delivered
        with self._emit_lock:
            text = cursor.accept(raw.decode("utf-8", "replace").rstrip("\r"))
            if text is None:
                return
            try:
                self.on_line(text)
            except Exception as e:  # the caller's callback must not end the stream
                self.log.warning("torchstep: on_line raised %s: %s", type(e).__name__, e)

    def _finish_logs(self) -> None:
        """Let the followers read the last lines of finished pods, then stop them."""
        if not self._refused:  # refused: nothing of this run's to follow
            self._follow_new_pods_quietly()
        self._stop_logs.set()
        deadline = time.time() + 10.0
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.time()))

    def _follow_new_pods_quietly(self) -> None:
        try:
            self._follow_new_pods()
        except Exception as e:
            self.log.warning("torchstep: listing pods for their last log lines: %s", e)

    # -- the log cursor, for a watcher that reattaches -----------------------------------------------
    def save_cursor(self, *, force: bool = False) -> None:
        """Save where every pod's log follower is (if it moved): as an annotation on the
        first workload and in ``cursor_store``. At most every ``cursor_interval`` seconds
        unless ``force``; a failure to save is a warning, never the run's failure.

        Args:
            force: save now, however recently the last save was.
        """
        now = time.monotonic()
        if not force and now - self._saved_at < self.cursor_interval:
            return
        with self._emit_lock:
            positions = {name: c.position() for name, c in self._cursors.items()}
        pods = {name: pos for name, pos in positions.items() if pos is not None}
        self._saved_at = now
        if not pods or pods == self._saved:
            return
        value = {"pods": {name: [key, count] for name, (key, count) in sorted(pods.items())}}
        if not force:  # at the end the workload may be about to go; the store is enough
            self._annotate(value)
        if self.cursor_store is not None:
            try:
                self.cursor_store.set(CURSOR_KEY, value)
            except Exception as e:
                self.log.warning("torchstep: saving the log position: %s", e)
        self._saved = pods

    def _annotate(self, value: dict[str, Any]) -> None:
        role = self.rendered.roles[0]
        patch = {"metadata": {"annotations": {CURSOR_ANNOTATION: json.dumps(value, separators=(",", ":"))}}}
        try:
            if role.kind == "Job":
                self.client.patch_namespaced_job(role.name, self.ns, body=patch)
            else:
                self.client.patch_namespaced_pod(role.name, self.ns, body=patch)
        except Exception as e:  # the cursor is an optimisation: lines repeat, none is lost
            self.log.warning("torchstep: saving the log position on %s %s: %s", role.kind, role.name, e)

    def _resume_from(self, workload: Any) -> None:
        if self.rendered.roles and get(workload, "metadata", "name") == self.rendered.roles[0].name:
            text = (get(workload, "metadata", "annotations") or {}).get(CURSOR_ANNOTATION)
            self._resume_merge(cursor_value(text))

    def _store_get(self) -> Any:
        try:
            return self.cursor_store.get(CURSOR_KEY) if self.cursor_store is not None else None
        except Exception as e:
            self.log.warning("torchstep: reading the saved log position: %s", e)
            return None

    def _resume_merge(self, found: dict[str, tuple[str, int]]) -> None:
        for name, pos in found.items():  # the furthest of the two saved positions
            if name not in self._resume or pos > self._resume[name]:
                self._resume[name] = pos

    # -- result and cleanup ------------------------------------------------------------------------
    def collect(self, state: str, started: float) -> StepResult:
        """The step result from the latest pod of every replica of this run (only its own
        pods: see the module docstring), merged (:func:`torchstep.kubernetes.collect.collect`).

        Args:
            state: the step's state as :meth:`wait` found it.
            started: unix time the run started (for the duration).

        Returns:
            The merged step result.
        """
        return collect(self.rendered, self._pods(), state, started, self.preemptions)

    def delete(self) -> None:
        """Delete every object of the run: Jobs and Pods with foreground propagation (their
        pods, and the Services they own, go first), then any Service left. After a refusal
        (an existing object that is not this run's), only what this object created is
        deleted, by name: the refused object is left alone."""
        sel = self.rendered.label_selector
        if self._refused:
            self._delete_created(sel)
            return
        calls = deletions(self.client, self.ns, sel)
        for what, call in calls:
            try:  # deleting by label is idempotent: retried after transient errors, a little
                self._api(
                    f"delete {what} {self.ns} ({sel})",
                    call,
                    budget_s=min(self.api_retry_budget_s, DELETE_RETRY_BUDGET_S),
                )
            except Exception as e:  # keep deleting the rest
                self.log.warning("torchstep: cleanup of %s (%s): %s", what, sel, e)

    def _delete_created(self, sel: str) -> None:
        for kind, name in self._created:
            field = f"metadata.name={name}"
            try:
                if kind == "Job":
                    self.client.delete_collection_namespaced_job(
                        self.ns, label_selector=sel, field_selector=field, propagation_policy="Foreground"
                    )
                else:
                    self.client.delete_collection_namespaced_pod(
                        self.ns, label_selector=sel, field_selector=field, propagation_policy="Foreground"
                    )
            except Exception as e:  # keep deleting the rest
                self.log.warning("torchstep: cleanup of %s %s: %s", kind, name, e)


def _print_line(text: str) -> None:
    print(text, flush=True)
