"""Kueue's visible contract, played on the one-machine cluster (test infrastructure; Kueue's
own controllers cannot run here). What a Job in a LocalQueue sees of Kueue, and nothing else:

- **suspended until admitted**: a Job labelled ``kueue.x-k8s.io/queue-name`` stays
  ``spec.suspend: true`` (torchstep creates it so; Kueue's webhook would force it) and its
  Job controller creates no pod;
- **admission**: Kueue writes the admitted flavor's ``nodeSelector`` and ``tolerations`` into
  the pod template (``podSetInfo``) and sets ``spec.suspend: false``; the Job controller then
  creates the pods (and ``activeDeadlineSeconds`` counts from then);
- **eviction** (preemption by a higher-priority workload, ``waitForPodsReady`` timeout, a
  ClusterQueue change): Kueue sets ``spec.suspend: true`` again and restores the original pod
  template; the Job controller deletes the running pods without counting them as failures;
  the Workload (not modelled: no Workload objects here) is requeued and admitted again later.

- **waitForPodsReady** (:class:`WaitForPodsReady`, when given): an admitted Job must reach
  ``PodsReady`` — ``status.ready + status.succeeded >= min(parallelism, completions)``, as
  Kueue's Job integration counts, so it rests on the pods' readiness probes — within
  ``timeout``, else it is evicted: its Workload gets ``Evicted`` (reason ``PodsReadyTimeout``,
  message ``Exceeded the PodsReady timeout <ns>/<name>``) and ``Requeued=False`` (same
  reason), ``requeueState.count`` + 1 and ``requeueAt`` after the backoff
  (``backoffBaseSeconds * 2^(count-1)``, at most ``backoffMaxSeconds``; no jitter here); once
  ``requeueAt`` passes, ``Requeued=True`` (``BackoffFinished``) and it may be admitted again.

Each Job's Workload is a plain dict here (``workload(name)``: ``status.conditions`` with
``QuotaReserved``, ``Admitted``, ``PodsReady`` (reasons ``WaitForStart`` / ``Started``),
``Evicted``, ``Requeued``, ``requeueState`` and ``schedulingStats``), not an API object.

- **recoveryTimeout** (``WaitForPodsReady.recovery_timeout_s``; Kueue's default: the value of
  ``timeout``, 0 turns it off): a Job that was ``PodsReady`` and has a pod not Ready any more
  (a pod lost and its replacement not started, a gang that does not form again) gets
  ``PodsReady=False`` with reason ``WaitForRecovery`` (message ``At least one pod has failed,
  waiting for recovery``); Ready again within ``recoveryTimeout`` of that transition, it is
  ``PodsReady=True`` with reason ``Recovered``; past it, it is evicted as for the first
  timeout (``Evicted``/``Requeued`` reason ``PodsReadyTimeout``, the same message and
  requeuing backoff), and ``status.schedulingStats.evictions`` counts it under
  ``underlyingCause`` ``WaitForRecovery`` (``WaitForStart`` for the first timeout), as
  Kueue's workload controller does (``admittedNotReadyWorkload``, ``reconcileNotReadyTimeout``).

What is not played: quotas, flavors, cohorts, priorities, partial admission's parallelism
change, ``blockAdmission``, ``backoffLimitCount`` (deactivation). The tests drive admission and preemption explicitly,
so each transition happens when the test says (deterministic under load); the
waitForPodsReady timer runs on its own, as Kueue's does.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cluster.harness import Cluster

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODS_READY_TIMEOUT = "PodsReadyTimeout"  # Kueue's WorkloadEvictedByPodsReadyTimeout
WAIT_FOR_START = "WaitForStart"  # PodsReady=False: not all pods ready since the admission
WAIT_FOR_RECOVERY = "WaitForRecovery"  # PodsReady=False: they were, and one is not any more
RECOVERED = "Recovered"  # PodsReady=True again after WaitForRecovery


@dataclass(frozen=True)
class WaitForPodsReady:
    """Kueue's ``waitForPodsReady`` configuration (the fields this controller plays).

    Args:
        timeout_s: ``timeout`` (Kueue's default: 5 minutes).
        backoff_base_s: ``requeuingStrategy.backoffBaseSeconds`` (Kueue's default: 60).
        backoff_max_s: ``requeuingStrategy.backoffMaxSeconds`` (Kueue's default: 3600).
        recovery_timeout_s: ``recoveryTimeout``; ``None``: Kueue's default, ``timeout_s``;
            ``0``: off (a gang that was ready is never evicted for losing a pod).
    """

    timeout_s: float = 300.0
    backoff_base_s: float = 60.0
    backoff_max_s: float = 3600.0
    recovery_timeout_s: float | None = None

    @property
    def recovery_s(self) -> float:
        """The recoveryTimeout in effect (0: off)."""
        return self.timeout_s if self.recovery_timeout_s is None else self.recovery_timeout_s


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(int(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Kueue:
    """Admits and evicts the cluster's queued Jobs as Kueue would (see the module docstring).

    Args:
        cluster: the one-machine cluster whose Jobs it manages.
        wait_for_pods_ready: Kueue's ``waitForPodsReady`` (a timer thread runs it; call
            :meth:`close` at the end); ``None``: not enabled, as in Kueue's default.
    """

    def __init__(self, cluster: Cluster, wait_for_pods_ready: WaitForPodsReady | None = None) -> None:
        self.cluster = cluster
        self._templates: dict[str, dict[str, Any]] = {}  # Job name -> its pod template before admission
        self.admissions: list[str] = []
        self.evictions: list[str] = []
        self.wait_for_pods_ready = wait_for_pods_ready
        self._workloads: dict[str, dict[str, Any]] = {}  # Job name -> its Workload (a plain dict)
        self._admitted_at: dict[str, float] = {}
        self._recovering_since: dict[str, float] = {}  # Job name -> when PodsReady became WaitForRecovery
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if wait_for_pods_ready is not None:
            self._thread = threading.Thread(target=self._watch, daemon=True, name="kueue-podsready")
            self._thread.start()

    def close(self) -> None:
        """Stop the waitForPodsReady timer (the tests call it at their end)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def workload(self, name: str) -> dict[str, Any]:
        """A copy of Job ``name``'s Workload (``status.conditions``, ``status.requeueState``)."""
        with self._lock:
            return copy.deepcopy(self._workload(name))

    def condition(self, name: str, kind: str) -> dict[str, Any] | None:
        """The condition ``kind`` of Job ``name``'s Workload, or ``None``."""
        return next((c for c in self.workload(name)["status"]["conditions"] if c["type"] == kind), None)

    def _workload(self, name: str) -> dict[str, Any]:
        return self._workloads.setdefault(name, {"metadata": {"name": f"job-{name}"}, "status": {"conditions": []}})

    def _set(self, name: str, kind: str, status: bool, reason: str, message: str = "") -> None:
        conditions = self._workload(name)["status"]["conditions"]
        old = next((c for c in conditions if c["type"] == kind), None)
        value = "True" if status else "False"
        if old is not None and (old["status"], old["reason"]) == (value, reason):
            return
        entry = {
            "type": kind,
            "status": value,
            "reason": reason,
            "message": message,
            "lastTransitionTime": _stamp(time.time()),
        }
        conditions[:] = [c for c in conditions if c["type"] != kind] + [entry]

    def queued(self, queue: str) -> list[dict[str, Any]]:
        """The Jobs of ``queue`` waiting for admission (suspended)."""
        return [j for j in self.cluster.items("jobs", f"{QUEUE_LABEL}={queue}") if j["spec"].get("suspend")]

    def admit(
        self, name: str, node_selector: dict[str, str] | None = None, tolerations: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """Admit Job ``name``: inject the flavor's node selector and tolerations into its pod
        template, then unsuspend it (one update, as Kueue's job reconciler does)."""
        job = self.cluster.get("jobs", name)
        assert job["spec"].get("suspend"), f"Job {name} is not suspended: Kueue admits only suspended Jobs"
        assert job["metadata"]["labels"].get(QUEUE_LABEL), f"Job {name} has no {QUEUE_LABEL} label"
        with self._lock:
            requeue = self._workload(name)["status"].get("requeueState") or {}
            at = requeue.get("requeueAt")
            assert at is None or at <= time.time(), f"Job {name} is in its requeuing backoff until {_stamp(at)}"
        template = job["spec"]["template"]
        self._templates.setdefault(name, copy.deepcopy(template))
        admitted = copy.deepcopy(template)
        spec = admitted["spec"]
        if node_selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **node_selector}
        if tolerations:
            spec["tolerations"] = [*(spec.get("tolerations") or []), *tolerations]
        out = self.cluster.api(
            "PATCH", self.cluster.path("jobs", name), {"spec": {"template": admitted, "suspend": False}}
        )
        assert out.get("kind") == "Job", out
        self.admissions.append(name)
        with self._lock:
            self._admitted_at[name] = time.time()
            for kind in ("QuotaReserved", "Admitted"):
                self._set(name, kind, True, kind, "admitted by the test's ClusterQueue")
            self._recovering_since.pop(name, None)
            self._set(name, "PodsReady", False, WAIT_FOR_START, "Not all pods are ready or succeeded")
            if self._condition(name, "Evicted") is not None:  # as Kueue's SetQuotaReservation
                self._set(name, "Evicted", False, "QuotaReserved", "Previously: evicted")
        return out

    def evict(
        self, name: str, reason: str = "Preempted", message: str = "Preempted by a higher-priority workload"
    ) -> dict[str, Any]:
        """Evict admitted Job ``name``: suspend it again and restore its original pod template
        (the Job controller deletes its pods, uncounted); its Workload says ``Evicted``
        with ``reason``."""
        job = self.cluster.get("jobs", name)
        assert not job["spec"].get("suspend"), f"Job {name} is not admitted: nothing to evict"
        body: dict[str, Any] = {"suspend": True}
        if name in self._templates:
            body["template"] = self._templates[name]
        out = self.cluster.api("PATCH", self.cluster.path("jobs", name), {"spec": body})
        assert out.get("kind") == "Job", out
        with self._lock:
            self._admitted_at.pop(name, None)
            self._recovering_since.pop(name, None)
            self._set(name, "Evicted", True, reason, message)
            for kind in ("QuotaReserved", "Admitted"):
                self._set(name, kind, False, "Pending", message)
        self.evictions.append(name)
        return out

    # -- waitForPodsReady ------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                names = list(self._admitted_at)
            for name in names:
                self._check(name)
            self._requeue()

    def _check(self, name: str) -> None:
        """One look at admitted Job ``name``: PodsReady (``Started``, or ``Recovered`` after
        ``WaitForRecovery``), or evicted past the timeout or the recoveryTimeout."""
        config = self.wait_for_pods_ready
        assert config is not None
        job = self.cluster.get("jobs", name)
        if job.get("kind") != "Job":
            return
        spec, status = job["spec"], job.get("status") or {}
        if any(c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in status.get("conditions") or []):
            with self._lock:  # a finished Workload is never evicted
                self._admitted_at.pop(name, None)
            return
        wanted = min(int(spec.get("parallelism", 1)), int(spec.get("completions") or spec.get("parallelism", 1)))
        now = time.time()
        with self._lock:
            since = self._admitted_at.get(name)
            if since is None:
                return
            podsready = self._condition(name, "PodsReady") or {}
            if int(status.get("ready") or 0) + int(status.get("succeeded") or 0) >= wanted:
                recovered = podsready.get("reason") in (WAIT_FOR_RECOVERY, RECOVERED)
                self._recovering_since.pop(name, None)
                self._set(
                    name,
                    "PodsReady",
                    True,
                    RECOVERED if recovered else "Started",
                    "All pods reached readiness and the workload is running",
                )
                return
            if podsready.get("status") == "True" or podsready.get("reason") == WAIT_FOR_RECOVERY:
                # it was running: a pod not ready any more is waited for up to recoveryTimeout
                if name not in self._recovering_since:
                    self._recovering_since[name] = now
                    self._set(
                        name, "PodsReady", False, WAIT_FOR_RECOVERY, "At least one pod has failed, waiting for recovery"
                    )
                cause = WAIT_FOR_RECOVERY
                if config.recovery_s <= 0 or now - self._recovering_since[name] < config.recovery_s:
                    return
            else:
                cause = WAIT_FOR_START
                if now - since < config.timeout_s:
                    return
        message = f"Exceeded the PodsReady timeout {job['metadata']['namespace']}/{name}"
        with self._lock:  # the requeuing backoff first: nothing may admit it again before it passed
            wl_status = self._workload(name)["status"]
            state = wl_status.setdefault("requeueState", {"count": 0})
            state["count"] += 1
            backoff = min(config.backoff_base_s * 2 ** (state["count"] - 1), config.backoff_max_s)
            state["requeueAt"] = time.time() + backoff
            self._set(name, "Requeued", False, PODS_READY_TIMEOUT, message)
            evictions = wl_status.setdefault("schedulingStats", {}).setdefault("evictions", [])
            entry = next(
                (e for e in evictions if (e["reason"], e["underlyingCause"]) == (PODS_READY_TIMEOUT, cause)), None
            )
            if entry is None:
                evictions.append({"reason": PODS_READY_TIMEOUT, "underlyingCause": cause, "count": 1})
            else:
                entry["count"] += 1
        self.evict(name, PODS_READY_TIMEOUT, message)

    def _condition(self, name: str, kind: str) -> dict[str, Any] | None:
        return next((c for c in self._workload(name)["status"]["conditions"] if c["type"] == kind), None)

    def _requeue(self) -> None:
        """Workloads whose requeuing backoff has passed may be admitted again."""
        with self._lock:
            for name, wl in self._workloads.items():
                state = wl["status"].get("requeueState") or {}
                at = state.get("requeueAt")
                if at is not None and at <= time.time():
                    state["requeueAt"] = None
                    self._set(name, "Requeued", True, "BackoffFinished", "The workload backoff was finished")
