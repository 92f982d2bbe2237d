"""A local HTTP fake of the Kubernetes API paths ``torchstep.kubernetes.JobGang`` uses, in its
own process, so its state outlives the process that watches a step: a test can SIGKILL the
watcher (an Airflow task process, a launcher) and run the step again against the same
"cluster". Test code, not product code; no cluster exists on these machines.

What it serves, exactly as the official ``kubernetes`` client (30.x) calls it:

- ``batch/v1`` jobs: create (409 ``AlreadyExists`` when the name exists), get, ``/status``,
  list and delete-collection by ``labelSelector``, merge PATCH of metadata;
- ``v1`` pods: create, get, ``/status``, list / delete-collection by ``labelSelector``,
  PATCH, ``/log`` with ``follow``, ``timestamps``, ``sinceSeconds``, ``sinceTime``;
- ``v1`` services: create (409), list, delete by name;
- ``coordination.k8s.io/v1`` leases (``--real`` only): create (409), get, PUT with the
  ``resourceVersion`` check (409 ``Conflict`` for a stale one): the store witness's Lease;
- ``networking.k8s.io/v1`` networkpolicies: create, get, list, delete — stored, **never
  enforced** (no network plugin here); ``v1`` events: list (the ``--real`` mode records them);
- the watch API for pods and Jobs (``?watch=true``: ``resourceVersion``, ``timeoutSeconds``,
  ``allowWatchBookmarks``, 410 ``Expired`` for a version older than the history kept), with
  the real API server's resourceVersion semantics: ``tests/apiwatch.py``;
- ``GET /debug/state``: counters (``jobs_created``, ``pods_created``, ``conflicts``,
  ``patches``, ``log_requests``, ``faults_answered``, ``streams_cut``, ``pods_replaced``,
  ``lists``, ``reads_<kind>`` (gets of one object), ``watch_requests``, ``watches_cut``,
  ``watches_expired``, ``evictions``, ``deleted``) and every object;
- ``POST /debug/fault`` (JSON body), a fault injected now: ``{"status": 500, "count": N}``
  answers the next N API requests (``"match"``: only those whose path holds that text;
  ``"methods"``: only those methods) with that status and a ``Status`` body, with
  ``"retry_after": S`` a ``Retry-After: S`` header too (a 429 of API Priority and Fairness);
  ``{"cut_logs": N}`` cuts the next N followed log streams once they sent a line (the
  connection is closed without the last chunk, as a reset watch); ``{"cut_watches": N}``
  closes the next N watches that have an event to send, without it (a reset connection; with
  ``"expire": true`` the history is compacted as it is cut: its reconnection gets 410);
  ``{"compact": true}`` forgets every change so far, this request's deletion included (a
  watch resuming from before gets 410);
  ``{"evict_pod": I}`` evicts it instead (the ``DisruptionTarget`` condition, then deleted at
  once: not counted against ``backoffLimitPerIndex``, as the rendered ``podFailurePolicy``
  says); ``{"delete_pod": I}``
  deletes the running pod of completion index I (``kubectl delete pod``). It answers
  ``{"ok": true, ...}`` (``"pod"``: the deleted pod's name, ``null`` when none ran).

Pods run by the wall clock, from a :class:`Scenario`: creating a Job creates one pod per
completion index (a bare Pod is its own), each writes ``lines`` one every ``line_interval_s``
seconds (RFC 3339 timestamps of the moment each "appeared"), runs ``run_s`` seconds, then
terminates with ``codes[index]`` and ``messages[index]`` as its termination message (the
agent's result summary). A followed log streams lines as they appear until the pod ends.
Every object gets a ``metadata.uid``; a Job's pods get the ``ownerReferences`` entry the Job
controller sets (``controller: true``, the Job's uid). A running pod of a Job deleted on its
own (not with its Job) is replaced as the Job controller does (the agent was SIGTERMed: exit
143, counted against ``backoffLimitPerIndex``; past it the Job fails): the replacement
writes the lines its predecessor had not written yet, from the last one it wrote (a worker
resumes after its checkpoint), as incarnation 1, 2...

With ``line_template`` (``str.format`` fields ``role``, ``index``, ``rank``, ``attempt``,
``pid``, ``line``), each of a pod's ``lines`` is ``procs`` lines, one per rank of the pod
(ranks ``procs*index`` ...), each rank with its own fake pid per incarnation: what a
replica of the agent with ``nproc_per_node=procs`` prints. A pod created directly can replace
what the scenario says for it with two test-only annotations (an impostor's forged result):
``kubehttp/message`` (its termination message) and ``kubehttp/line`` (the text of its lines).
Delete-collection honours ``fieldSelector=metadata.name=...``.

With ``start_server(..., real=...)`` (``--real``) nothing is scripted: the Job controller,
the garbage collector and a kubelet of ``tests/cluster`` run every pod for real (own network,
UTS and PID namespaces, cluster DNS, memory limits; root needed), and ``POST /debug/node``
drains, loses or partitions a node (see ``tests/cluster/controller.py``).

    server = start_server(tmp_path, Scenario(replicas=2, run_s=5))
    kube = OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)
    ...
    server.state()["jobs_created"]; server.stop()
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import kubeexec  # tests/ is this script's directory (and on pytest's path)
from apifaults import ApiFaults
from apiwatch import ApiWatch, matches

INDEX = "batch.kubernetes.io/job-completion-index"


@dataclass
class Scenario:
    """What every pod of the fake cluster does (index ``i`` of a Job; a bare Pod is index 0)."""

    replicas: int = 2
    run_s: float = 5.0
    codes: list[int] = field(default_factory=list)  # per index; default 0
    messages: list[str | None] = field(default_factory=list)  # termination message per index
    lines: int = 20  # lines each pod writes: "[role/<index>] line <k>"
    line_interval_s: float = 0.1
    line_template: str | None = None  # see the module docstring
    procs: int = 1  # ranks per pod (with line_template)

    def code(self, index: int) -> int:
        return self.codes[index] if index < len(self.codes) else 0

    def message(self, index: int) -> str | None:
        return self.messages[index] if index < len(self.messages) else None


def _now() -> str:
    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(t: float) -> str:
    """RFC 3339 with nanoseconds, as the kubelet writes log timestamps."""
    whole = int(t)
    return datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{int((t - whole) * 1e9):09d}Z"


class Cluster(ApiFaults, ApiWatch):
    """The state of the fake API server (one lock; every handler thread uses it)."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.lock = threading.Lock()
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (kind, ns, name) -> object
        self.started: dict[str, float] = {}  # pod name -> start time
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
        }
        self.deleted: list[str] = []
        self.answer: dict[str, Any] | None = None  # the pending status fault (POST /debug/fault)
        self.cut_logs = 0  # followed log streams still to cut
        self.failures: dict[tuple[str, int], int] = {}  # (Job uid, index) -> pods lost (counted)
        self.init_watch()

    # -- objects ------------------------------------------------------------------------------------
    def create(self, kind: str, ns: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        name = body["metadata"]["name"]
        with self.lock:
            if (kind, ns, name) in self.objects:
                self.counters["conflicts"] += 1
                plural = {"Job": "jobs.batch", "Pod": "pods", "Service": "services"}.get(kind, kind.lower() + "s")
                return 409, _status(409, "AlreadyExists", f'{plural} "{name}" already exists')
            obj = json.loads(json.dumps(body))
            obj["metadata"].update(namespace=ns, uid=str(uuid.uuid4()), creationTimestamp=_now(), resourceVersion="1")
            self.objects[(kind, ns, name)] = obj
            counter = {"Job": "jobs_created", "Pod": "pods_created", "Service": "services_created"}.get(kind)
            if counter is not None:  # a NetworkPolicy is stored, never enforced
                self.counters[counter] += 1
            if kind == "Job":
                template = obj["spec"]["template"]
                owner = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": name,
                    "uid": obj["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }  # as the Job controller sets it
                for index in range(int(obj["spec"].get("completions") or 1)):
                    self._job_pod(ns, name, template, owner, index, {})
            elif kind == "Pod":
                self.started[name] = time.time()
            return 201, self.view(kind, obj)

    def _job_pod(
        self, ns: str, job: str, template: dict[str, Any], owner: dict[str, Any], index: int, extra: dict[str, str]
    ) -> str:
        """Start the pod of completion ``index`` of Job ``job`` (under the lock)."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{job}-{index}-{uuid.uuid4().hex[:5]}",
                "namespace": ns,
                "labels": {**template["metadata"].get("labels", {}), "job-name": job},
                "annotations": {INDEX: str(index), **extra},
                "uid": str(uuid.uuid4()),
                "creationTimestamp": _now(),
                "ownerReferences": [owner],
            },
            "spec": template["spec"],
        }
        self.objects[("Pod", ns, pod["metadata"]["name"])] = pod
        self.started[pod["metadata"]["name"]] = time.time()
        return str(pod["metadata"]["name"])

    def _replace(self, ns: str, pod: dict[str, Any]) -> None:
        """The Job controller after a running pod of its Job was deleted (under the lock):
        count the loss against ``backoffLimitPerIndex`` and start a replacement that writes
        the rest of the lines, from the last one the lost pod wrote."""
        ref = next((r for r in pod["metadata"].get("ownerReferences") or [] if r.get("controller")), None)
        job = next(
            (
                o
                for (k, n, _), o in self.objects.items()
                if k == "Job" and n == ns and ref is not None and o["metadata"]["uid"] == ref["uid"]
            ),
            None,
        )
        if job is None or ref is None or self._pod_status(pod)["phase"] != "Running":
            return
        index = self._index(pod)
        key = (ref["uid"], index)
        spec = job["spec"]
        notes = pod["metadata"].get("annotations") or {}
        if "kubehttp/evicted" not in notes:  # podFailurePolicy ignores a DisruptionTarget pod
            self.failures[key] = self.failures.get(key, 0) + 1
            limit = spec.get("backoffLimitPerIndex", spec.get("backoffLimit", 6))
            if self.failures[key] > int(limit):
                return  # the index failed: the Job's view says Failed
        written, _, _ = self._written(pod)
        first = written[-1][1] if written else int(notes.get("kubehttp/first-line", 0))
        extra = {
            "kubehttp/incarnation": str(int(notes.get("kubehttp/incarnation", 0)) + 1),
            "kubehttp/first-line": str(first),
        }
        self._job_pod(ns, ref["name"], spec["template"], ref, index, extra)
        self.counters["pods_replaced"] += 1

    def get(self, kind: str, ns: str, name: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.counters[f"reads_{kind.lower()}"] = self.counters.get(f"reads_{kind.lower()}", 0) + 1
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
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
        return {"apiVersion": "v1", "kind": f"{kind}List", "metadata": {"resourceVersion": version}, "items": items}

    def patch(self, kind: str, ns: str, name: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            obj = self.objects.get((kind, ns, name))
            if obj is None:
                return 404, _status(404, "NotFound", f'{kind.lower()}s "{name}" not found')
            self.counters["patches"] += 1
            for key in ("annotations", "labels"):
                obj["metadata"][key] = {
                    **(obj["metadata"].get(key) or {}),
                    **((body.get("metadata") or {}).get(key) or {}),
                }
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
        only = field.partition("metadata.name=")[2] if field else None
        with self.lock:
            doomed = [
                key
                for key, o in self.objects.items()
                if key[0] == kind
                and key[1] == ns
                and (key[2] == name if name is not None else matches(o["metadata"].get("labels") or {}, selector))
                and (only is None or key[2] == only)
            ]
            self.sync_watch()  # a watch sees each object as it was last, even one deleted at once
            for key in doomed:
                gone = self.objects.pop(key)
                uid = gone["metadata"]["uid"]
                self.deleted.append(f"{kind}/{key[2]}")
                if kind == "Pod":
                    self._replace(ns, gone)
                if kind == "Job":  # foreground propagation: its pods and the Services it owns go too
                    for other, o in list(self.objects.items()):
                        owned = any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
                        if owned:
                            self.objects.pop(other)
                            self.deleted.append(f"{other[0]}/{other[2]}")
        return _status(200, "", "deleted", status="Success")

    # -- the simulated pods ---------------------------------------------------------------------------
    def _index(self, pod: dict[str, Any]) -> int:
        return int((pod["metadata"].get("annotations") or {}).get(INDEX, 0))

    def _pod_status(self, pod: dict[str, Any]) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        index = self._index(pod)
        elapsed = time.time() - self.started.get(name, time.time())
        main = (pod["spec"].get("containers") or [{"name": "main"}])[0]["name"]
        status: dict[str, Any] = {"name": main, "image": "fake", "imageID": "", "ready": True, "restartCount": 0}
        conditions = []
        if "kubehttp/evicted" in (pod["metadata"].get("annotations") or {}):
            conditions = [
                {
                    "type": "DisruptionTarget",
                    "status": "True",
                    "reason": "EvictionByEvictionAPI",
                    "message": "Eviction API: evicting",
                }
            ]
        if elapsed < self._run_s(pod):
            status["state"] = {"running": {"startedAt": _stamp(self.started.get(name, time.time()))}}
            return {"phase": "Running", "conditions": conditions, "containerStatuses": [status]}
        code = self.scenario.code(index)
        status["ready"] = False
        message = (pod["metadata"].get("annotations") or {}).get("kubehttp/message", self.scenario.message(index))
        status["state"] = {"terminated": {"exitCode": code, "message": message}}
        return {"phase": "Succeeded" if code == 0 else "Failed", "conditions": [], "containerStatuses": [status]}

    def view(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """The object as the API returns it, its status computed now (called under the lock)."""
        out = json.loads(json.dumps(obj))
        out.setdefault("apiVersion", {"Job": "batch/v1", "NetworkPolicy": "networking.k8s.io/v1"}.get(kind, "v1"))
        out.setdefault("kind", kind)
        if kind == "Pod":
            out["status"] = self._pod_status(obj)
        elif kind == "Job":
            uid = obj["metadata"]["uid"]  # the Job controller counts the pods it owns
            pods = [
                self._pod_status(p)
                for (k, n, _), p in self.objects.items()
                if k == "Pod" and any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
            ]
            phases = [p["phase"] for p in pods]
            conditions = []
            spec = obj["spec"]
            limit = int(spec.get("backoffLimitPerIndex", spec.get("backoffLimit", 6)))
            if "Failed" in phases or any(u == uid and n > limit for (u, _), n in self.failures.items()):
                conditions = [{"type": "Failed", "status": "True"}]
            elif phases and all(p == "Succeeded" for p in phases):
                conditions = [{"type": "Complete", "status": "True"}]
            out["status"] = {"conditions": conditions}
        return out

    def _run_s(self, pod: dict[str, Any]) -> float:
        """How long a pod runs: a replacement only what its predecessor had left."""
        first = int((pod["metadata"].get("annotations") or {}).get("kubehttp/first-line", 0))
        return max(self.scenario.run_s - first * self.scenario.line_interval_s, self.scenario.line_interval_s)

    def _written(self, pod: dict[str, Any]) -> tuple[list[tuple[float, int, str]], bool, int]:
        """``(time, line number, text)`` of every line ``pod`` has written by now, whether it
        ended, and how many it writes in all (under the lock)."""
        s = self.scenario
        name, index = pod["metadata"]["name"], self._index(pod)
        notes = pod["metadata"].get("annotations") or {}
        start = self.started[name]
        role = (pod["metadata"].get("labels") or {}).get("torchstep/role", "role")
        first, attempt = int(notes.get("kubehttp/first-line", 0)), int(notes.get("kubehttp/incarnation", 0))
        written = []
        for j, k in enumerate(range(first, s.lines)):
            t = start + (j + 1) * s.line_interval_s
            if s.line_template is None or "kubehttp/line" in notes:
                written.append((t, k, f"{notes.get('kubehttp/line', f'[{role}/{index}] line')} {k}"))
                continue
            for local in range(s.procs):
                rank = s.procs * index + local
                pid = 100000 + 1000 * attempt + rank
                fields = {"role": role, "index": index, "rank": rank, "attempt": attempt, "pid": pid, "line": k}
                written.append((t, k, s.line_template.format(**fields)))
        total = len(written) if s.line_template is not None else s.lines - first
        now = time.time()
        return [w for w in written if w[0] <= now], now - start >= self._run_s(pod), total

    def log_lines(self, name: str) -> tuple[list[tuple[float, str]], bool, int]:
        """The lines pod ``name`` has written by now, whether it ended, and how many it will write."""
        with self.lock:
            pod = next((o for (k, _, n), o in self.objects.items() if k == "Pod" and n == name), None)
            if pod is None:
                return [], True, 0
            written, ended, total = self._written(pod)
        return [(t, text) for t, _, text in written], ended, total

    # -- injected faults (POST /debug/fault) ----------------------------------------------------------
    def fault(self, body: dict[str, Any]) -> dict[str, Any]:
        """Arm or inject one fault (see the module docstring)."""
        with self.lock:
            self.arm_faults(body)
            self.arm_watch_faults({**body, "compact": False})  # compacted last, after this request's deletion
            running = None
            index = body.get("delete_pod", body.get("evict_pod"))
            if index is not None:
                running = next(
                    (
                        key
                        for key, o in self.objects.items()
                        if key[0] == "Pod"
                        and self._index(o) == int(index)
                        and self._pod_status(o)["phase"] == "Running"
                    ),
                    None,
                )
            if running is not None and "evict_pod" in body:
                self.objects[running]["metadata"].setdefault("annotations", {})["kubehttp/evicted"] = "true"
                self.counters["evictions"] = self.counters.get("evictions", 0) + 1
        if running is not None:
            self.delete("Pod", running[1], running[2], None)
        if body.get("compact"):
            with self.lock:
                self.arm_watch_faults({"compact": True})
        return {"ok": True, "pod": running[2] if running else None}


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


_PATH = re.compile(
    r"^/(?:api/v1|apis/batch/v1|apis/networking\.k8s\.io/v1|apis/coordination\.k8s\.io/v1)/namespaces/([^/]+)"
    r"/(jobs|pods|services|networkpolicies|events|leases)(?:/([^/]+))?(?:/(status|log))?$"
)
_KINDS = {
    "jobs": "Job",
    "pods": "Pod",
    "services": "Service",
    "networkpolicies": "NetworkPolicy",
    "events": "Event",
    "leases": "Lease",
}


class Handler(BaseHTTPRequestHandler):
    cluster: Any  # Cluster (scripted) or cluster.controller.RealCluster (--real)
    protocol_version = "HTTP/1.1"  # a followed log is chunked, as the API server sends it

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[str, str, str | None, str | None, dict[str, str]] | None:
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        m = _PATH.match(url.path)
        if m is None:
            return None
        ns, plural, name, sub = m.groups()
        return _KINDS[plural], ns, name, sub, query

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"{}") if length else {}

    def _faulted(self) -> bool:
        """Answer an armed status fault (POST /debug/fault) instead of the request."""
        if self.path.startswith("/debug/"):
            return False
        answer = self.cluster.answered(self.command, self.path)
        if answer is None:
            return False
        code, after = answer
        self._body()
        data = json.dumps(_status(code, {429: "TooManyRequests"}.get(code, "InternalError"), "injected")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if after is not None:
            self.send_header("Retry-After", str(after))
        self.end_headers()
        self.wfile.write(data)
        return True

    def _exec(self) -> bool:
        """Serve a pod's ``exec`` subresource (``tests/kubeexec.py``); ``False``: not one."""
        where = kubeexec.exec_path(self.path)
        if where is None:
            return False
        if not hasattr(self.cluster, "procs"):  # scripted pods have no processes to enter
            self._send(400, _status(400, "BadRequest", "exec needs the one-machine cluster (--real)"))
        else:
            kubeexec.serve(self, *where)
        return True

    def do_GET(self) -> None:
        if self._faulted() or self._exec():
            return
        if self.path.startswith("/debug/state"):
            c = self.cluster
            with c.lock:
                objects = [
                    {
                        "kind": k,
                        "name": n,
                        "labels": o["metadata"].get("labels") or {},
                        "annotations": o["metadata"].get("annotations") or {},
                        "uid": o["metadata"]["uid"],
                    }
                    for (k, _, n), o in c.objects.items()
                ]
                self._send(
                    200,
                    {
                        **c.counters,
                        "deleted": list(c.deleted),
                        "objects": objects,
                        "failures": [[u, i, n] for (u, i), n in c.failures.items()],
                    },
                )
            return
        route = self._route()
        if route is None:
            return self._send(404, _status(404, "NotFound", self.path))
        kind, ns, name, sub, query = route
        if name is None and query.get("watch", "").lower() in ("true", "1"):
            return self._watch(kind, ns, query)
        if name is None:
            return self._send(200, self.cluster.list(kind, ns, query.get("labelSelector")))
        if sub == "log":
            return self._log(name, query)
        self._send(*self.cluster.get(kind, ns, name))

    def do_POST(self) -> None:
        if self.path.startswith("/debug/fault"):
            return self._send(200, self.cluster.fault(self._body()))
        if self.path.startswith("/debug/node"):
            if not hasattr(self.cluster, "node"):
                return self._send(404, _status(404, "NotFound", "nodes exist only with --real"))
            return self._send(200, self.cluster.node(self._body()))
        if self._faulted() or self._exec():
            return
        route = self._route()
        if route is None or route[2] is not None:
            return self._send(404, _status(404, "NotFound", self.path))
        self._send(*self.cluster.create(route[0], route[1], self._body()))

    def do_PATCH(self) -> None:
        if self._faulted():
            return
        route = self._route()
        if route is None or route[2] is None:
            return self._send(404, _status(404, "NotFound", self.path))
        self._send(*self.cluster.patch(route[0], route[1], route[2], self._body()))

    def do_PUT(self) -> None:
        if self._faulted():
            return
        route = self._route()
        if route is None or route[2] is None or not hasattr(self.cluster, "replace"):
            return self._send(404, _status(404, "NotFound", self.path))
        self._send(*self.cluster.replace(route[0], route[1], route[2], self._body()))

    def do_DELETE(self) -> None:
        if self._faulted():
            return
        route = self._route()
        if route is None:
            return self._send(404, _status(404, "NotFound", self.path))
        kind, ns, name, _, query = route
        body = self._body()
        for key in ("propagationPolicy", "gracePeriodSeconds"):  # DeleteOptions, in the body or the query
            if key in query:
                body[key] = int(query[key]) if key == "gracePeriodSeconds" else query[key]
        self._send(
            200, self.cluster.delete(kind, ns, name, query.get("labelSelector"), query.get("fieldSelector"), body=body)
        )

    def _chunk(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        data = b"".join(json.dumps({"type": t, "object": o}).encode() + b"\n" for t, o in events)
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _watch(self, kind: str, ns: str, query: dict[str, str]) -> None:
        """A watch (tests/apiwatch.py): newline-delimited JSON events, chunked, until
        ``timeoutSeconds``; 410 as an ``ERROR`` event; ``cut_watches`` resets it."""
        c = self.cluster
        selector, since = query.get("labelSelector"), query.get("resourceVersion")
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        start = c.watch_start(kind, ns, selector, since)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if start is None:  # etcd compacted it: the client must list again
                gone = _status(410, "Expired", f"too old resource version: {since} ({c.compacted})")
                self._chunk([("ERROR", gone)])
            else:
                pos, events = start
                if events:
                    self._chunk(events)
                deadline = time.monotonic() + float(query.get("timeoutSeconds") or 1800)
                quiet = time.monotonic()
                while time.monotonic() < deadline:
                    pos_now, events = c.watch_next(kind, ns, selector, pos)
                    if events:
                        if c.watch_cut():  # a reset connection: the event is never sent
                            self.close_connection = True
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        self._chunk(events)
                        quiet = time.monotonic()
                    elif bookmarks and time.monotonic() - quiet >= 1.0:
                        version = {"Job": "batch/v1"}.get(kind, "v1")
                        self._chunk(
                            [
                                (
                                    "BOOKMARK",
                                    {
                                        "kind": kind,
                                        "apiVersion": version,
                                        "metadata": {"resourceVersion": str(pos_now)},
                                    },
                                )
                            ]
                        )
                        quiet = time.monotonic()
                    pos = pos_now
                    time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError, OSError):  # the watcher went away
            self.close_connection = True

    def _log(self, name: str, query: dict[str, str]) -> None:
        c = self.cluster
        with c.lock:
            c.counters["log_requests"] += 1
        follow = query.get("follow", "").lower() == "true"
        stamps = query.get("timestamps", "").lower() == "true"
        since = time.time() - int(query["sinceSeconds"]) if "sinceSeconds" in query else None
        if "sinceTime" in query:
            since = datetime.fromisoformat(query["sinceTime"].replace("Z", "+00:00")).timestamp()
        if since is not None:
            since = float(int(since))  # second resolution, as the API server: the reader sees an overlap
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            while True:
                lines, ended, total = c.log_lines(name)
                data = b"".join(
                    ((f"{_stamp(t)} " if stamps else "") + text + "\n").encode()
                    for t, text in lines[sent:]
                    if since is None or t >= since
                )
                if data:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                sent = len(lines)
                if follow and sent and c.cut():  # a reset watch: closed without the last chunk
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if not follow or (ended and sent >= total) or (ended and not lines):
                    break
                time.sleep(0.05)
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the reader died (a SIGKILLed watcher)
            self.close_connection = True


# -- running it -----------------------------------------------------------------------------------------
@dataclass
class KubeServer:
    """A running fake API server (see :func:`start_server`)."""

    url: str
    kubeconfig: Path
    process: subprocess.Popen[bytes]

    def state(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/debug/state", timeout=10) as r:
            return dict(json.loads(r.read()))

    def fault(self, **body: Any) -> dict[str, Any]:
        """Inject a fault now (``POST /debug/fault``; see the module docstring).

        Args:
            **body: ``status``/``count``/``retry_after``/``match``/``methods``, ``cut_logs``,
                ``cut_watches`` (``expire``), ``compact``
                ``delete_pod`` or ``evict_pod``.

        Returns:
            The fake's answer (``pod``: the pod ``delete_pod`` deleted).
        """
        request = urllib.request.Request(
            f"{self.url}/debug/fault",
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as r:
            return dict(json.loads(r.read()))

    def node(self, node: str, action: str, **extra: Any) -> dict[str, Any]:
        """Act on a node of a ``--real`` cluster (``POST /debug/node``).

        Args:
            node: the node's name (``node-0`` ...); ignored by ``cut-pod`` / ``restore-pod``.
            action: ``drain``, ``lose``, ``partition``, ``heal``, ``slow-pulls``; ``cut-pod``,
                ``restore-pod`` or ``signal-pod`` (its PID 1, from the node).
            **extra: ``pod=NAME`` for the pod actions, ``signal=N`` for ``signal-pod``,
                ``seconds=S`` for ``slow-pulls``.

        Returns:
            The server's answer (``pods``: the pods that were on the node).

        Raises:
            RuntimeError: the server refused (an unknown node or action).
        """
        request = urllib.request.Request(
            f"{self.url}/debug/node",
            method="POST",
            data=json.dumps({"node": node, "action": action, **extra}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            answer = dict(json.loads(r.read()))
        if not answer.get("ok"):
            raise RuntimeError(f"node {node} {action}: {answer.get('error')}")
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)  # a --real cluster stops its pods and removes its namespaces
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(tmp_path: Path, scenario: Scenario | None = None, *, real: dict[str, Any] | None = None) -> KubeServer:
    """Start the fake in its own session (a SIGKILLed watcher never takes it down) and write
    a kubeconfig for it; the caller stops it (``.stop()``).

    With ``real`` (``tests/cluster/conftest.py`` builds it: ``root``, ``prefix``, ``path``,
    ``nodes``, ``node_grace_s``) the pods run for real on the one-machine cluster of
    ``tests/cluster`` (root and namespaces needed) instead of by the ``scenario``."""
    scenario = scenario or Scenario()
    tmp_path.mkdir(parents=True, exist_ok=True)
    port_file = tmp_path / "kubeapi.port"
    scenario_file = tmp_path / "kubeapi.scenario.json"
    scenario_file.write_text(json.dumps(asdict(scenario)))
    mode = ["--scenario", str(scenario_file)]
    if real is not None:
        real_file = tmp_path / "kubeapi.real.json"
        real_file.write_text(json.dumps(real))
        mode = ["--real", str(real_file)]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--port-file", str(port_file), *mode],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "kubeapi.log", "wb"),
    )
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"the fake API server did not start: {(tmp_path / 'kubeapi.log').read_text()}")
        time.sleep(0.05)
    url = f"http://127.0.0.1:{int(port_file.read_text())}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "ml"}}],
            }
        )
    )
    os.chmod(kubeconfig, 0o600)
    return KubeServer(url, kubeconfig, proc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port-file", required=True)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--scenario", help="scripted pods: a Scenario as JSON")
    mode.add_argument("--real", help="pods run for real (tests/cluster): its config as JSON")
    ns = ap.parse_args()
    if ns.real:
        from cluster.controller import RealCluster  # tests/ is this script's directory
        from cluster.incluster import ServiceAccount, serve_in_cluster

        real = RealCluster(json.loads(Path(ns.real).read_text()))
        Handler.cluster = real
        serve_in_cluster(Handler, real.network.ns, ServiceAccount(real.root))  # what the pods reach
    else:
        Handler.cluster = Cluster(Scenario(**json.loads(Path(ns.scenario).read_text())))
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    tmp = Path(ns.port_file + ".tmp")
    tmp.write_text(str(server.server_address[1]))
    tmp.replace(ns.port_file)
    try:
        server.serve_forever()
    finally:
        if hasattr(Handler.cluster, "close"):
            Handler.cluster.close()


if __name__ == "__main__":
    main()
