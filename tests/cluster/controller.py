"""The control plane of the one-machine cluster: the API objects, the Job controller, the
garbage collector, the scheduler and the nodes, over a :class:`~cluster.kubelet.Kubelet`
that runs every pod for real. ``tests/kubehttp.py --real`` serves it (same paths, same
``/debug`` endpoints as its scripted mode, plus ``POST /debug/node``).

Test infrastructure. What it executes of Kubernetes' semantics:

- **Indexed Jobs**: one pod per completion index up to ``parallelism`` (name
  ``<job>-<index>-<random>``, ``hostname`` ``<job>-<index>``, the completion-index annotation
  and labels, ``ownerReferences`` with ``controller: true``); ``backoffLimit``,
  ``backoffLimitPerIndex`` / ``maxFailedIndexes`` (``failedIndexes``, the
  ``batch.kubernetes.io/job-index-failure-count`` annotation), ``podFailurePolicy`` rules in
  order (``onExitCodes`` In/NotIn, ``onPodConditions`` such as ``DisruptionTarget``; actions
  FailJob, FailIndex, Ignore, Count), ``podReplacementPolicy`` (``Failed``: a replacement only
  once the old pod is terminal; ``TerminatingOrFailed``: as soon as it is terminating),
  ``suspend`` (its pods deleted, never counted as failures) and resume,
  ``activeDeadlineSeconds`` (``DeadlineExceeded``; counted from the last resume),
  ``ttlSecondsAfterFinished``; conditions ``Complete`` / ``Failed`` with Kubernetes' reasons,
  ``active``, ``ready``, ``succeeded``, ``failed``, ``completedIndexes``;
- **garbage collection** by ``ownerReferences`` (a Job deleted with ``Foreground`` stays,
  marked, until its pods are gone; otherwise its pods are deleted after it);
- **pods**: scheduling onto ready, schedulable nodes (fewest pods first), deletion as
  SIGTERM then SIGKILL after the grace period, the object gone once its processes are;
- **headless Services**: DNS records ``<hostname>.<subdomain>.<ns>.svc.cluster.local`` and
  ``<service>.<ns>.svc.cluster.local`` for the pods they select, published once a pod has its
  IP (``publishNotReadyAddresses`` changes nothing here: records exist whatever the pods'
  readiness);
- **readiness**: a container's exec ``readinessProbe`` runs inside its pod (see
  ``cluster/kubelet.py``) and sets the pod's ``Ready`` / ``ContainersReady`` conditions,
  ``containerStatuses[].ready`` and the Job's ``status.ready``; without a probe a pod is
  ready once its container runs;
- **nodes**: ``drain`` (cordon, then every pod evicted with the ``DisruptionTarget``
  condition), ``lose`` (every process SIGKILLed and the node's link cut; the API hears nothing
  until the node is ``NotReady`` after ``node_grace_s``, then its pods get ``DisruptionTarget``
  and fail), ``partition`` (the link cut, the processes alive; ``NotReady`` likewise, the pods
  left as they are), ``heal``, ``restore`` (a lost node back, empty: a rebooted machine),
  ``slow-pulls`` (its pods' sandboxes — IP, DNS name — come at once, their containers
  ``seconds`` later, as behind a slow image pull);
- the **watch API** of pods and Jobs with resourceVersions (``tests/apiwatch.py``);
- **events** (``SuccessfulCreate``, ``Started``, ``Killing``, ``Evicted``, ``Completed``,
  ``BackoffLimitExceeded``, ...), NetworkPolicies stored and listed (**not enforced**).

Not executed: admission (no webhooks, quotas or defaulting beyond what is above), a real
scheduler (no resources, affinity, taints), image pulls, liveness and startup probes, init containers,
``successPolicy``. A pod's containers after the first (such as the KubernetesPodOperator's XCom sidecar)
run, each in its own mount and PID namespaces, in the pod's network namespace and cgroup (one memory limit
for the pod: the first container's); the pod stays ``Running`` until every container has ended, and its
``exec`` subresource enters any running one (``tests/kubeexec.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import string
import sys
import threading
import time
import traceback
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from apifaults import ApiFaults
from apiwatch import ApiWatch, matches

from cluster.kubelet import DOMAIN, INDEX, Dns, Kubelet, KubeletConfig, Network, PodProcess, remove_cgroups, rfc3339

FAILURE_COUNT = "batch.kubernetes.io/job-index-failure-count"
PLURALS = {
    "Job": "jobs.batch",
    "Pod": "pods",
    "Service": "services",
    "NetworkPolicy": "networkpolicies",
    "Event": "events",
    "Lease": "leases.coordination.k8s.io",
}
API_VERSIONS = {"Job": "batch/v1", "NetworkPolicy": "networking.k8s.io/v1", "Lease": "coordination.k8s.io/v1"}


def _status(code: int, reason: str, message: str, status: str = "Failure") -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": status,
        "reason": reason,
        "message": message,
        "code": code,
    }


def _now() -> str:
    return rfc3339(time.time())


def _ranges(indexes: set[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"``, as the Job status writes index sets."""
    out: list[str] = []
    for i in sorted(indexes):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ",".join(out)


class JobState:
    """What the Job controller tracks of one Job (its status is derived from it)."""

    def __init__(self) -> None:
        self.started = time.time()
        self.failed = 0  # counted pod failures (backoffLimit)
        self.per_index: dict[int, int] = {}  # counted failures per index (backoffLimitPerIndex)
        self.succeeded: set[int] = set()
        self.failed_indexes: set[int] = set()
        self.condition: tuple[str, str, str] | None = None  # (type, reason, message) once finished
        self.finished: float | None = None
        self.suspended = False
        self.suspended_at = 0.0  # the Suspended condition's lastTransitionTime (a watch sees it change once)
        self.counted: set[str] = set()  # pod uids already accounted


class RealCluster(ApiFaults, ApiWatch):
    """The API state and its controllers (one lock; the HTTP handler threads use it too)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.root = Path(config["root"])
        self.prefix = str(config["prefix"])
        self.node_grace_s = float(config.get("node_grace_s", 2.0))
        self.lock = threading.RLock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.counters = {
            "jobs_created": 0,
            "pods_created": 0,
            "services_created": 0,
            "conflicts": 0,
            "patches": 0,
            "log_requests": 0,
            "faults_answered": 0,
            "streams_cut": 0,
            "pods_replaced": 0,
            "evictions": 0,
        }
        self.deleted: list[str] = []
        self.failures: dict[tuple[str, int], int] = {}
        self.answer: dict[str, Any] | None = None
        self.cut_logs = 0
        self.init_watch()
        self.jobs: dict[str, JobState] = {}  # Job uid -> its controller state
        self.procs: dict[str, PodProcess] = {}  # pod uid -> its process
        names = list(config.get("nodes") or ["node-0", "node-1"])
        self.nodes: dict[str, dict[str, Any]] = {
            n: {"ready": True, "schedulable": True, "lost": False, "partitioned": False, "since": None} for n in names
        }
        self.root.mkdir(parents=True, exist_ok=True)
        self.network = Network(self.prefix)
        self.network.up(names)
        self.kubelet = Kubelet(
            KubeletConfig(self.root, str(config["path"]), self.prefix),
            self.network,
            self._ended,
            self._started,
            self._readiness,
        )
        self.kubelet.on_main_end = self._main_ended
        self.dns = Dns(self.root, self.network.ns, self.kubelet.cgroups / "dns")
        self.dns.start()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="controllers")
        self._thread.start()

    # -- the API -------------------------------------------------------------------------------------
    def create(self, kind: str, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        meta = body.get("metadata") or {}
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
        name = meta.get("name")
        if not name:
            return 422, _status(422, "Invalid", f"{PLURALS.get(kind, kind)}: metadata.name: Required value")
        with self.lock:
            if (kind, ns, name) in self.objects:
                self.counters["conflicts"] += 1
                return 409, _status(409, "AlreadyExists", f'{PLURALS.get(kind, kind)} "{name}" already exists')
            obj = json.loads(json.dumps(body))
            obj["metadata"] = {
                **obj.get("metadata", {}),
                "name": name,
                "namespace": ns,
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "resourceVersion": "1",
            }
            obj.setdefault("apiVersion", API_VERSIONS.get(kind, "v1"))
            obj["kind"] = kind
            self.objects[(kind, ns, name)] = obj
            key = {"Job": "jobs_created", "Pod": "pods_created", "Service": "services_created"}.get(kind)
            if key:
                self.counters[key] += 1
            if kind == "Pod":
                obj["status"] = {"phase": "Pending", "conditions": []}
            elif kind == "Job":
                self.jobs[obj["metadata"]["uid"]] = JobState()
                obj["status"] = {}
            return 201, self.view(kind, obj)

    def get(self, kind: str, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{PLURALS.get(kind, kind)} "{name}" not found')
            self.sync_watch()
            return 200, self.versioned(kind, ns, name, self.view(kind, obj))

    def list(self, kind: str, ns: str, selector: str | None) -> dict[str, Any]:
        with self.lock:
            self.sync_watch()
            self.counters["lists"] += 1
            items = [
                self.versioned(k, n, o["metadata"]["name"], self.view(k, o))
                for (k, n, _), o in self.objects.items()
                if k == kind and n == ns and matches(o["metadata"].get("labels") or {}, selector)
            ]
            version = str(self.revision)
        return {
            "apiVersion": API_VERSIONS.get(kind, "v1"),
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    def replace(self, kind: str, ns: str, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A PUT of a Lease (what leader election and the store witness write): the API
        server's optimistic concurrency, so of two writers that read the same version exactly
        one gets through and the other gets ``409 Conflict``."""
        if kind != "Lease":
            return 405, _status(405, "MethodNotAllowed", f"PUT of {PLURALS.get(kind, kind)} is not served here")
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{PLURALS[kind]} "{name}" not found')
            sent = (body.get("metadata") or {}).get("resourceVersion")
            if sent != obj["metadata"]["resourceVersion"]:
                self.counters["lease_conflicts"] = self.counters.get("lease_conflicts", 0) + 1
                return 409, _status(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {PLURALS[kind]} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                )
            self.revision += 1
            for key in ("annotations", "labels"):
                obj["metadata"][key] = dict((body.get("metadata") or {}).get(key) or {})
            obj["metadata"]["resourceVersion"] = str(self.revision)
            obj["spec"] = json.loads(json.dumps(body.get("spec") or {}))
            return 200, self.view(kind, obj)

    def patch(self, kind: str, ns: str, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A merge patch of ``metadata.labels``/``annotations`` and of ``spec`` (``suspend``)."""
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{PLURALS.get(kind, kind)} "{name}" not found')
            self.counters["patches"] += 1
            for key in ("annotations", "labels"):
                obj["metadata"][key] = {
                    **(obj["metadata"].get(key) or {}),
                    **((body.get("metadata") or {}).get(key) or {}),
                }
            for key, value in (body.get("spec") or {}).items():
                if value is None:
                    obj["spec"].pop(key, None)
                else:
                    obj["spec"][key] = value
            return 200, self.view(kind, obj)

    def delete(
        self,
        kind: str,
        ns: str,
        name: str | None,
        selector: str | None,
        field: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = body or {}
        only = field.partition("metadata.name=")[2] if field else None
        grace = body.get("gracePeriodSeconds")
        foreground = body.get("propagationPolicy") == "Foreground"
        with self.lock:
            doomed = [
                key
                for key, o in self.objects.items()
                if key[0] == kind
                and key[1] == ns
                and (key[2] == name if name is not None else matches(o["metadata"].get("labels") or {}, selector))
                and (only is None or key[2] == only)
            ]
            for key in doomed:
                self._delete(key, grace=grace, foreground=foreground)
        return _status(200, "", "deleted", status="Success")

    def _delete(self, key: tuple[str, str, str], grace: float | None = None, foreground: bool = False) -> None:
        """Delete one object (under the lock): a running pod terminates first; a Job deleted
        in the foreground waits for its pods; the garbage collector takes what it owned."""
        obj = self.objects.get(key)
        if obj is None:
            return
        kind = key[0]
        if kind == "Pod":
            proc = self.procs.get(obj["metadata"]["uid"])
            if proc is not None and proc.proc is not None and not proc.ended.is_set():
                if "deletionTimestamp" not in obj["metadata"]:
                    obj["metadata"]["deletionTimestamp"] = _now()
                    g = obj["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace
                    obj["metadata"]["deletionGracePeriodSeconds"] = g
                    self._event(obj, "Killing", f"Stopping container {proc.container}")
                    self.kubelet.delete(proc.uid, float(g))
                return
            if proc is not None:
                self.kubelet.delete(proc.uid, 0)
        if kind == "Job" and foreground:
            obj["metadata"]["deletionTimestamp"] = _now()
            obj["metadata"]["finalizers"] = ["foregroundDeletion"]
            return  # the garbage collector removes it once nothing it owns is left
        self.sync_watch()  # a watch sees each object as it was last, even one deleted at once
        self.objects.pop(key)
        self.deleted.append(f"{kind}/{key[2]}")

    def log_lines(self, name: str) -> tuple[list[tuple[float, str]], bool, int]:
        """The pod's log: ``(time, line)`` so far, whether its container ended, how many lines."""
        with self.lock:
            pod = next((o for (k, _, n), o in self.objects.items() if k == "Pod" and n == name), None)
            proc = self.procs.get(pod["metadata"]["uid"]) if pod is not None else None
        if proc is None:
            return [], pod is None or pod["status"].get("phase") in ("Succeeded", "Failed"), 0
        ended = (proc.main_ended if proc.sidecars else proc.ended).is_set()  # the first container's log
        lines = []
        for raw in proc.log.read_text(errors="replace").splitlines():
            when, _, text = raw.partition(" ")
            with contextlib.suppress(ValueError):
                t = datetime.fromisoformat(when[:26] + "+00:00").timestamp()
                lines.append((t, text))
        return lines, ended, len(lines)

    def view(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        out = json.loads(json.dumps(obj))
        out.setdefault("apiVersion", API_VERSIONS.get(kind, "v1"))
        out.setdefault("kind", kind)
        return out

    # -- injected faults (the scripted mode's /debug/fault) ---------------------------------------------
    def fault(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.arm_faults(body)
            self.arm_watch_faults(body)
            running = None
            if "delete_pod" in body:
                running = next(
                    (
                        key
                        for key, o in self.objects.items()
                        if key[0] == "Pod"
                        and int((o["metadata"].get("annotations") or {}).get(INDEX, 0)) == int(body["delete_pod"])
                        and o["status"].get("phase") == "Running"
                        and "deletionTimestamp" not in o["metadata"]
                    ),
                    None,
                )
            if running is not None:
                self._delete(running)
        return {"ok": True, "pod": running[2] if running else None}

    # -- nodes ---------------------------------------------------------------------------------------
    def node(self, body: dict[str, Any]) -> dict[str, Any]:
        """``{"node": NAME, "action": "drain" | "lose" | "partition" | "heal" | "restore" | "slow-pulls",
        "seconds": S}`` (a drain's ``grace_s``: the evicted pods' grace period, 0 for SIGKILL
        at once; default their own), or
        ``{"action": "cut-pod" | "restore-pod" | "signal-pod", "pod": NAME, "signal": N}`` (a
        test's hand on the machines: ``signal-pod`` signals the container's PID 1 from the node)."""
        action, name = body.get("action"), body.get("node")
        with self.lock:
            if action in ("cut-pod", "restore-pod", "signal-pod"):
                pod = next((o for (k, _, n), o in self.objects.items() if k == "Pod" and n == body.get("pod")), None)
                proc = self.procs.get(pod["metadata"]["uid"]) if pod else None
                if proc is None or proc.ended.is_set():
                    return {"ok": False, "error": f"pod {body.get('pod')!r} is not running"}
                if action == "signal-pod":  # from the node, as `kill` of the host PID crictl names
                    proc.signal(int(body.get("signal", 9)))
                else:
                    self.network.set_pod_link(proc.slot, action == "restore-pod")
                return {"ok": True, "pods": [proc.name]}
            node = self.nodes.get(str(name))
            if node is None:
                return {"ok": False, "error": f"no node {name!r}; nodes: {sorted(self.nodes)}"}
            on_node = [
                key
                for key, o in self.objects.items()
                if key[0] == "Pod"
                and o["spec"].get("nodeName") == name
                and o["status"].get("phase") not in ("Succeeded", "Failed")
            ]
            if action == "drain":
                node["schedulable"] = False
                for key in on_node:
                    pod = self.objects[key]
                    self._condition(pod, "DisruptionTarget", "EvictionByEvictionAPI", "Eviction API: evicting")
                    self.counters["evictions"] += 1
                    self._event(pod, "Evicted", f"node {name} drained")
                    self._delete(key, grace=body.get("grace_s"))
            elif action == "lose":
                node.update(lost=True, since=time.time())
                self.network.set_node_link(str(name), False)
                for key in on_node:
                    uid = self.objects[key]["metadata"]["uid"]
                    if uid in self.procs:
                        self.kubelet.kill(uid)
            elif action == "partition":
                node.update(partitioned=True, since=time.time())
                self.network.set_node_link(str(name), False)
            elif action == "slow-pulls":
                node["pull_s"] = float(body.get("seconds", 0))
            elif action == "heal":
                node.update(schedulable=True, partitioned=False, ready=True, since=None)
                if not node["lost"]:
                    self.network.set_node_link(str(name), True)
            elif action == "restore":  # a lost node back, empty (a rebooted or replaced machine)
                node.update(lost=False, schedulable=True, partitioned=False, ready=True, since=None)
                self.network.set_node_link(str(name), True)
            else:
                return {
                    "ok": False,
                    "error": f"unknown action {action!r}: drain, lose, partition, heal, restore, slow-pulls",
                }
            return {"ok": True, "pods": [k[2] for k in on_node]}

    # -- the kubelet's reports -------------------------------------------------------------------------
    def _ended(self, proc: PodProcess) -> None:
        """A container ended: record its termination (unless its node is lost: nobody reports)."""
        with self.lock:
            key = ("Pod", proc.ns, proc.name)
            pod = self.objects.get(key)
            if pod is None or pod["metadata"]["uid"] != proc.uid:
                return
            if self.nodes.get(proc.node, {}).get("lost"):
                return
            self._terminated(pod, proc)
            if "deletionTimestamp" in pod["metadata"]:
                self._account(pod)
                self.sync_watch()
                self.objects.pop(key, None)
                self.deleted.append(f"Pod/{proc.name}")

    @staticmethod
    def _terminated_state(proc: PodProcess) -> dict[str, Any]:
        """The ``state`` of ``proc``'s ended container, as kubelet reports it."""
        return {
            "terminated": {
                "exitCode": proc.exit_code if proc.exit_code is not None else 137,
                "reason": proc.reason or "Error",
                "startedAt": rfc3339(proc.started_at or time.time()),
                "finishedAt": rfc3339(proc.finished_at or time.time()),
                "containerID": f"onemachine://{proc.uid}",
                **({"message": proc.message} if proc.message else {}),
            }
        }

    def _terminated(self, pod: dict[str, Any], proc: PodProcess) -> None:
        state = self._terminated_state(proc)
        code = state["terminated"]["exitCode"]
        status = pod["status"]
        codes = [code, *(c.exit_code if c.exit_code is not None else 137 for c in proc.sidecars)]
        status["phase"] = "Succeeded" if not any(codes) else "Failed"  # every container's, as kubelet
        status["containerStatuses"] = [self._container(proc, state, ready=False), *self._sidecars(proc)]
        for c in status.get("conditions", []):
            if c["type"] in ("Ready", "ContainersReady"):
                c["status"] = "False"
        reason = {"OOMKilled": "OOMKilling"}.get(proc.reason or "", "Completed" if code == 0 else "Failed")
        self._event(pod, reason, f"container {proc.container} exited {code} ({proc.reason})")

    def _main_ended(self, proc: PodProcess) -> None:
        """The first container of a pod with sidecars ended: its status says so, the pod runs on."""
        with self.lock:
            pod = self.objects.get(("Pod", proc.ns, proc.name))
            if pod is None or pod["metadata"]["uid"] != proc.uid or self.nodes.get(proc.node, {}).get("lost"):
                return
            state = self._terminated_state(proc)
            pod["status"]["containerStatuses"] = [self._container(proc, state, ready=False), *self._sidecars(proc)]
            for c in pod["status"].get("conditions", []):
                if c["type"] in ("Ready", "ContainersReady"):
                    c["status"] = "False"
            self._event(
                pod, "Completed", f"container {proc.container} exited {state['terminated']['exitCode']} ({proc.reason})"
            )

    def _sidecars(self, proc: PodProcess) -> list[dict[str, Any]]:
        """The status of a pod's containers after the first (``containerStatuses[1:]``)."""
        out = []
        for c in proc.sidecars:
            if c.exit_code is not None:
                state: dict[str, Any] = {
                    "terminated": {
                        "exitCode": c.exit_code,
                        "reason": "Completed" if c.exit_code == 0 else "Error",
                        "startedAt": rfc3339(c.started_at or time.time()),
                        "finishedAt": rfc3339(c.finished_at or time.time()),
                    }
                }
            elif c.proc is not None:
                state = {"running": {"startedAt": rfc3339(c.started_at or time.time())}}
            else:
                state = {"waiting": {"reason": "ContainerCreating"}}
            out.append(
                {
                    "name": c.name,
                    "image": "onemachine",
                    "imageID": "",
                    "ready": "running" in state,
                    "restartCount": 0,
                    "started": "running" in state,
                    "state": state,
                }
            )
        return out

    def _container(self, proc: PodProcess, state: dict[str, Any], ready: bool) -> dict[str, Any]:
        return {
            "name": proc.container,
            "image": "onemachine",
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "started": "running" in state,
            "state": state,
        }

    # -- the controllers -----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.reconcile()
            except Exception:  # a controller bug must show (in kubeapi.log), not stop the cluster
                traceback.print_exc(file=sys.stderr)

    def reconcile(self) -> None:
        """One pass of every controller: nodes, jobs, garbage collection, scheduling, DNS."""
        with self.lock:
            self._nodes()
            for key, job in list(self.objects.items()):
                if key[0] == "Job" and key in self.objects:
                    self._job(job)
            self._collect_garbage()
            pending = [
                o
                for (k, _, _), o in self.objects.items()
                if k == "Pod" and not o["spec"].get("nodeName") and "deletionTimestamp" not in o["metadata"]
            ]
            placed = [(pod, self._schedule(pod)) for pod in pending]
        for pod, node in placed:
            if node is not None:
                self._run(pod, node)
        with self.lock:
            self.dns.sync(self._records())

    def _nodes(self) -> None:
        now = time.time()
        for name, node in self.nodes.items():
            if (node["lost"] or node["partitioned"]) and node["ready"] and now - node["since"] >= self.node_grace_s:
                node["ready"] = False
                if node["lost"]:  # the pods of a gone node: DisruptionTarget, then Failed (PodGC)
                    for key, pod in list(self.objects.items()):
                        if (
                            key[0] == "Pod"
                            and pod["spec"].get("nodeName") == name
                            and pod["status"].get("phase") not in ("Succeeded", "Failed")
                        ):
                            self._condition(
                                pod,
                                "DisruptionTarget",
                                "DeletionByTaintManager",
                                f"Taint manager: deleting due to NoExecute taint (node {name} lost)",
                            )
                            pod["status"]["phase"] = "Failed"
                            proc = self.procs.get(pod["metadata"]["uid"])
                            state = {
                                "terminated": {
                                    "exitCode": 137,
                                    "reason": "Error",
                                    "finishedAt": _now(),
                                    "startedAt": _now(),
                                }
                            }
                            if proc is not None:
                                pod["status"]["containerStatuses"] = [self._container(proc, state, False)]
                            self._event(pod, "NodeNotReady", f"node {name} is not ready")

    def _schedule(self, pod: dict[str, Any]) -> str | None:
        ready = [
            n
            for n, s in self.nodes.items()
            if s["ready"] and s["schedulable"] and not s["lost"] and not s["partitioned"]
        ]
        wanted = pod["spec"].get("nodeName") or (pod["spec"].get("nodeSelector") or {}).get("kubernetes.io/hostname")
        if wanted:
            ready = [n for n in ready if n == wanted]
        if not ready:
            return None
        load = {n: 0 for n in ready}
        for (k, _, _), o in self.objects.items():
            if k == "Pod" and o["spec"].get("nodeName") in load and o["status"].get("phase") in ("Pending", "Running"):
                load[o["spec"]["nodeName"]] += 1
        node = min(ready, key=lambda n: (load[n], n))
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()}]
        self._event(
            pod,
            "Scheduled",
            f"Successfully assigned {pod['metadata']['namespace']}/{pod['metadata']['name']} to {node}",
        )
        return node

    def _run(self, pod: dict[str, Any], node: str) -> None:
        """Start the pod (outside the lock: the sandbox takes some ``ip`` calls)."""
        snapshot = json.loads(json.dumps(pod))
        try:
            proc = self.kubelet.start(snapshot, node, float(self.nodes[node].get("pull_s", 0)))
        except Exception as e:
            with self.lock:
                pod["status"]["containerStatuses"] = [
                    {
                        "name": "main",
                        "image": "onemachine",
                        "imageID": "",
                        "ready": False,
                        "restartCount": 0,
                        "state": {"waiting": {"reason": "CreateContainerError", "message": str(e)}},
                    }
                ]
            return
        with self.lock:
            self.procs[proc.uid] = proc
            status = pod["status"]
            host_ip = f"10.244.{self.network.nodes.index(node) + 1}.1"  # the node's subnet (no node holds it)
            status.update(podIP=proc.ip, podIPs=[{"ip": proc.ip}], hostIP=host_ip, startTime=_now())
            if proc.waiting is not None and proc.waiting[0] == "ContainerCreating":
                reason, message = proc.waiting
                status["containerStatuses"] = [
                    self._container(proc, {"waiting": {"reason": reason, "message": message}}, False)
                ]
                self._event(pod, "Pulling", message)
                return
            if proc.waiting is not None:
                reason, message = proc.waiting
                status["containerStatuses"] = [
                    self._container(proc, {"waiting": {"reason": reason, "message": message}}, False)
                ]
                self._event(pod, "Failed", f"Error: {message}")
                return
            if not proc.ended.is_set():
                self._running(pod, proc)
            elif "deletionTimestamp" not in pod["metadata"] and pod["status"].get("phase") in ("Pending", None):
                self._terminated(pod, proc)

    def _started(self, proc: PodProcess) -> None:
        """A delayed container started (its node's slow "pull" is over)."""
        with self.lock:
            pod = self.objects.get(("Pod", proc.ns, proc.name))
            if (
                pod is not None
                and pod["metadata"]["uid"] == proc.uid
                and self.procs.get(proc.uid) is proc
                and not proc.ended.is_set()
                and pod["status"].get("phase") == "Pending"
            ):
                self._running(pod, proc)

    def _running(self, pod: dict[str, Any], proc: PodProcess) -> None:
        pod["status"]["phase"] = "Running"
        ready = proc.probe is None  # with a readinessProbe: not ready until it passes
        pod["status"]["containerStatuses"] = [
            self._container(proc, {"running": {"startedAt": _now()}}, ready),
            *self._sidecars(proc),
        ]
        self._condition(pod, "Initialized", None, None)
        for t in ("ContainersReady", "Ready"):
            self._condition(pod, t, None, None, status=ready)
        self._event(pod, "Started", f"Started container {proc.container}")

    def _readiness(self, proc: PodProcess, ready: bool) -> None:
        """The container's readinessProbe changed its verdict: the pod's conditions follow."""
        with self.lock:
            pod = self.objects.get(("Pod", proc.ns, proc.name))
            if pod is None or pod["metadata"]["uid"] != proc.uid or pod["status"].get("phase") != "Running":
                return
            for status in pod["status"].get("containerStatuses") or []:
                status["ready"] = ready
            for t in ("ContainersReady", "Ready"):
                self._condition(
                    pod,
                    t,
                    None if ready else "ContainersNotReady",
                    None if ready else f"containers with unready status: [{proc.container}]",
                    status=ready,
                )
            if not ready:
                self._event(pod, "Unhealthy", "Readiness probe failed")

    def _condition(
        self, pod: dict[str, Any], kind: str, reason: str | None, message: str | None, status: bool = True
    ) -> None:
        conditions = pod["status"].setdefault("conditions", [])
        entry = {"type": kind, "status": "True" if status else "False", "lastTransitionTime": _now()}
        if reason:
            entry.update(reason=reason, message=message or "")
        pod["status"]["conditions"] = [c for c in conditions if c["type"] != kind] + [entry]

    def _owned(self, uid: str, kind: str = "Pod") -> list[dict[str, Any]]:
        return [
            o
            for (k, _, _), o in self.objects.items()
            if k == kind and any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]

    def _job(self, job: dict[str, Any]) -> None:
        """The Job controller, one pass over one Job (under the lock)."""
        meta, spec = job["metadata"], job["spec"]
        uid = meta["uid"]
        st = self.jobs.setdefault(uid, JobState())
        pods = self._owned(uid)
        for pod in pods:
            if pod["status"].get("phase") in ("Succeeded", "Failed"):
                self._account(pod)
        completions = int(spec.get("completions") or 1)
        now = time.time()
        if st.condition is None:
            if spec.get("suspend") and not st.suspended:
                st.suspended, st.suspended_at = True, now
                for pod in pods:  # deleted by the suspension: never counted as failures (as Kubernetes)
                    if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                        st.counted.add(pod["metadata"]["uid"])
                    self._delete(("Pod", meta["namespace"], pod["metadata"]["name"]))
                self._event(job, "Suspended", "Job suspended")
            elif not spec.get("suspend") and st.suspended:
                st.suspended = False
                st.started = now  # activeDeadlineSeconds counts from the resume
                self._event(job, "Resumed", "Job resumed")
            deadline = spec.get("activeDeadlineSeconds")
            if deadline is not None and not st.suspended and now - st.started >= float(deadline):
                self._finish(job, st, "Failed", "DeadlineExceeded", "Job was active longer than specified deadline")
            elif len(st.succeeded) >= completions:
                self._finish(job, st, "Complete", "CompletionsReached", "Reached expected number of succeeded pods")
            elif "backoffLimitPerIndex" in spec and st.failed_indexes:
                most = spec.get("maxFailedIndexes")
                if most is not None and len(st.failed_indexes) > int(most):
                    self._finish(job, st, "Failed", "MaxFailedIndexesExceeded", "Job has exceeded maxFailedIndexes")
                elif len(st.succeeded) + len(st.failed_indexes) >= completions:
                    self._finish(job, st, "Failed", "FailedIndexes", "Job has failed indexes")
        if st.condition is None and not st.suspended and "deletionTimestamp" not in meta:
            self._create_pods(job, st, pods, completions)
        if st.condition is not None:
            for pod in pods:  # a finished Job's running pods are terminated
                if pod["status"].get("phase") not in ("Succeeded", "Failed"):
                    self._delete(("Pod", meta["namespace"], pod["metadata"]["name"]))
            ttl = spec.get("ttlSecondsAfterFinished")
            if ttl is not None and st.finished is not None and now - st.finished >= float(ttl):
                self._delete(("Job", meta["namespace"], meta["name"]))
        self._job_status(job, st, self._owned(uid))

    def _account(self, pod: dict[str, Any]) -> None:
        """Count a terminal pod of a Job once: success, or a failure through podFailurePolicy."""
        ref = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        if ref is None or ref["uid"] not in self.jobs:
            return
        st = self.jobs[ref["uid"]]
        uid = pod["metadata"]["uid"]
        if uid in st.counted or st.condition is not None:
            return
        job = next(
            (o for (k, _, _), o in self.objects.items() if k == "Job" and o["metadata"]["uid"] == ref["uid"]), None
        )
        if job is None:
            return
        st.counted.add(uid)
        index = int((pod["metadata"].get("annotations") or {}).get(INDEX, 0))
        if pod["status"].get("phase") == "Succeeded":
            st.succeeded.add(index)
            return
        spec = job["spec"]
        action = self._policy_action(spec, pod)
        if action == "Ignore":
            return
        if action == "FailJob":
            rule = "podFailurePolicy"
            self._finish(
                job,
                st,
                "Failed",
                "PodFailurePolicy",
                f"Pod {pod['metadata']['namespace']}/{pod['metadata']['name']} has condition "
                f"or exit code matched by {rule} (exit code {_exit_code(pod)})",
            )
            return
        if "backoffLimitPerIndex" in spec:
            st.per_index[index] = st.per_index.get(index, 0) + 1
            self.failures[(ref["uid"], index)] = st.per_index[index]
            if action == "FailIndex" or st.per_index[index] > int(spec["backoffLimitPerIndex"]):
                st.failed_indexes.add(index)
            st.failed += 1
            return
        st.failed += 1
        self.failures[(ref["uid"], index)] = self.failures.get((ref["uid"], index), 0) + 1
        if st.failed > int(spec.get("backoffLimit", 6)):
            self._finish(job, st, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")

    def _policy_action(self, spec: dict[str, Any], pod: dict[str, Any]) -> str:
        """The action of the first podFailurePolicy rule that matches the failed pod (Count if none)."""
        code = _exit_code(pod)
        conditions = {(c["type"], c["status"]) for c in pod["status"].get("conditions") or []}
        for rule in (spec.get("podFailurePolicy") or {}).get("rules") or []:
            on_codes = rule.get("onExitCodes")
            if on_codes is not None and code is not None and code != 0:
                inside = code in on_codes.get("values", [])
                if inside == (on_codes.get("operator", "In") == "In"):
                    return str(rule["action"])
            for cond in rule.get("onPodConditions") or []:
                if (cond["type"], cond.get("status", "True")) in conditions:
                    return str(rule["action"])
        return "Count"

    def _finish(self, job: dict[str, Any], st: JobState, kind: str, reason: str, message: str) -> None:
        st.condition = (kind, reason, message)
        st.finished = time.time()
        self._event(job, reason, message)

    def _create_pods(self, job: dict[str, Any], st: JobState, pods: list[dict[str, Any]], completions: int) -> None:
        spec = job["spec"]
        replace_terminating = spec.get("podReplacementPolicy") == "TerminatingOrFailed" and not spec.get(
            "podFailurePolicy"
        )
        busy: set[int] = set()
        active = 0
        for pod in pods:
            if pod["status"].get("phase") in ("Succeeded", "Failed"):
                continue
            if replace_terminating and "deletionTimestamp" in pod["metadata"]:
                continue
            busy.add(int((pod["metadata"].get("annotations") or {}).get(INDEX, 0)))
            active += 1
        parallelism = int(spec.get("parallelism", 1))
        for index in range(completions):
            if active >= parallelism:
                break
            if index in busy or index in st.succeeded or index in st.failed_indexes:
                continue
            self._job_pod(job, index, st.per_index.get(index, 0))
            active += 1

    def _job_pod(self, job: dict[str, Any], index: int, failures: int) -> None:
        meta = job["metadata"]
        template = job["spec"]["template"]
        name = f"{meta['name']}-{index}-{''.join(random.choices(string.ascii_lowercase + string.digits, k=5))}"
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            "job-name": meta["name"],
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": meta["uid"],
            "batch.kubernetes.io/controller-uid": meta["uid"],
            INDEX: str(index),
        }
        annotations = {**(template.get("metadata", {}).get("annotations") or {}), INDEX: str(index)}
        if "backoffLimitPerIndex" in job["spec"]:
            annotations[FAILURE_COUNT] = str(failures)
        spec = json.loads(json.dumps(template["spec"]))
        if job["spec"].get("completionMode") == "Indexed":
            spec.setdefault("hostname", f"{meta['name']}-{index}")
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "spec": spec,
            "metadata": {"name": name, "labels": labels, "annotations": annotations, "ownerReferences": [owner]},
        }
        self.create("Pod", meta["namespace"], body)
        if any(
            int((o["metadata"].get("annotations") or {}).get(INDEX, -1)) == index
            for o in self._owned(meta["uid"])
            if o["metadata"]["name"] != name
        ):
            self.counters["pods_replaced"] += 1
        self._event(job, "SuccessfulCreate", f"Created pod: {name}")

    def _job_status(self, job: dict[str, Any], st: JobState, pods: list[dict[str, Any]]) -> None:
        running = [
            p
            for p in pods
            if p["status"].get("phase") in ("Pending", "Running") and "deletionTimestamp" not in p["metadata"]
        ]
        status: dict[str, Any] = {
            "startTime": rfc3339(st.started),
            "active": len(running),
            "ready": sum(_is_ready(p) for p in running),
            "succeeded": len(st.succeeded),
            "failed": st.failed,
            "terminating": sum("deletionTimestamp" in p["metadata"] for p in pods),
        }
        if job["spec"].get("completionMode") == "Indexed":
            status["completedIndexes"] = _ranges(st.succeeded)
            if "backoffLimitPerIndex" in job["spec"]:
                status["failedIndexes"] = _ranges(st.failed_indexes)
        conditions = []
        if st.suspended:
            conditions.append(
                {
                    "type": "Suspended",
                    "status": "True",
                    "reason": "JobSuspended",
                    "message": "Job suspended",
                    "lastTransitionTime": rfc3339(st.suspended_at),
                }
            )
        if st.condition is not None:
            kind, reason, message = st.condition
            stamp = rfc3339(st.finished or time.time())
            target = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
            conditions += [
                {"type": target, "status": "True", "reason": reason, "message": message, "lastTransitionTime": stamp},
                {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": stamp},
            ]
            if kind == "Complete":
                status["completionTime"] = stamp
        status["conditions"] = conditions
        job["status"] = status

    def _collect_garbage(self) -> None:
        """Objects whose owners are gone are deleted; a foreground-deleted Job goes when its pods have."""
        uids = {o["metadata"]["uid"] for o in self.objects.values()}
        for key, obj in list(self.objects.items()):
            refs = obj["metadata"].get("ownerReferences") or []
            if refs and not any(r.get("uid") in uids for r in refs):
                self._delete(key)
            elif key[0] == "Job" and "deletionTimestamp" in obj["metadata"]:
                dependents = [
                    o
                    for o in self.objects.values()
                    if any(r.get("uid") == obj["metadata"]["uid"] for r in o["metadata"].get("ownerReferences") or [])
                ]
                for dep in dependents:
                    self._delete((dep["kind"], key[1], dep["metadata"]["name"]))
                if not [d for d in dependents if (d["kind"], key[1], d["metadata"]["name"]) in self.objects]:
                    self.sync_watch()
                    self.objects.pop(key, None)
                    self.deleted.append(f"Job/{key[2]}")

    def _records(self) -> dict[str, str]:
        """The DNS records every headless Service gives the pods it selects."""
        records: dict[str, str] = {}
        for (k, ns, name), svc in self.objects.items():
            spec = svc.get("spec") or {}
            if k != "Service" or spec.get("clusterIP") != "None" or not spec.get("selector"):
                continue
            lines = []
            for (pk, pns, _), pod in self.objects.items():
                ip = pod.get("status", {}).get("podIP") if pk == "Pod" else None
                if pk != "Pod" or pns != ns or not ip or pod["status"].get("phase") in ("Succeeded", "Failed"):
                    continue
                labels = pod["metadata"].get("labels") or {}
                if any(labels.get(key) != value for key, value in spec["selector"].items()):
                    continue
                names = [f"{name}.{ns}.svc.{DOMAIN}"]
                if pod["spec"].get("hostname") and pod["spec"].get("subdomain") == name:
                    names.insert(0, f"{pod['spec']['hostname']}.{name}.{ns}.svc.{DOMAIN}")
                lines.append(f"{ip} {' '.join(names)}")
            records[f"{ns}_{name}"] = "\n".join(lines) + "\n"
        return records

    def _event(self, obj: dict[str, Any], reason: str, message: str) -> None:
        meta = obj["metadata"]
        name = f"{meta['name']}.{uuid.uuid4().hex[:12]}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "type": "Warning" if reason in _WARNINGS else "Normal",
            "reason": reason,
            "message": message,
            "count": 1,
            "firstTimestamp": _now(),
            "lastTimestamp": _now(),
            "involvedObject": {
                "kind": obj.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
            },
        }
        self.objects[("Event", meta["namespace"], name)] = event

    # -- stopping ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the controllers, every pod, DNS, and remove the namespaces and cgroups."""
        self._stop.set()
        self._thread.join(5)
        self.kubelet.shutdown()
        self.dns.stop()
        self.network.down()
        remove_cgroups(self.kubelet.cgroups)


_WARNINGS = {
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "PodFailurePolicy",
    "Evicted",
    "Failed",
    "OOMKilling",
    "NodeNotReady",
    "MaxFailedIndexesExceeded",
    "FailedIndexes",
    "Unhealthy",
}


def _is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or [])


def _exit_code(pod: dict[str, Any]) -> int | None:
    for status in pod["status"].get("containerStatuses") or []:
        term = (status.get("state") or {}).get("terminated")
        if term is not None:
            return int(term["exitCode"])
    return None


def new_prefix() -> str:
    """A short unique prefix for one cluster's namespaces and cgroups (``ip`` names are short)."""
    return f"ts{os.getpid() % 1000:03d}{uuid.uuid4().hex[:3]}"
