"""``JobSet``: the lifecycle of a rendered app on a cluster, for every adapter.

Create the objects of :func:`torchstep.kubernetes.render_app` (each role's Job or Pod, and
its headless Service owned by it), wait for the workloads, follow every pod's log as lines
to a callback (the pods of replaced replicas too; a dropped stream is reattached without
repeating or losing a line), collect the step result from the pods (each agent writes its
result summary as the container's termination message; one
:class:`~torchstep.result.StepResult` through :func:`torchstep.result.merge`), cancel, and
delete everything with foreground propagation on every exit path.

The Kubernetes client is injected (:class:`~torchstep.kubernetes.client.KubernetesClient`),
so Airflow's hook, a KFP launcher pod's in-cluster config or a Prefect worker's kubeconfig
all drive the same code.

Example::

    rendered = torchstep.kubernetes.render_app(app, namespace="ml", cfg={"run_id": run_id})
    jobs = JobSet(rendered, OfficialClient.from_config(), on_line=print)
    result = jobs.run()          # blocks; jobs.cancel() from another thread stops it
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from torchstep.errors import SpecError
from torchstep.kubernetes.client import KubernetesClient
from torchstep.kubernetes.failure import FailureKind, classify_exit
from torchstep.kubernetes.pod import CONTAINER_NAME
from torchstep.kubernetes.render import LABEL_ROLE, RenderedApp, owned_by
from torchstep.result import CANCELLED, FAILED, SUCCEEDED, ReplicaResult, StepResult, merge

#: What happens to the objects when the run ends: always deleted, deleted only after
#: success (failed pods stay for inspection), or kept.
ON_FINISH = ("delete", "delete_succeeded", "keep")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: How often a dropped log stream of a running pod is reattached before giving up on it.
MAX_REATTACH = 100
log = logging.getLogger("torchstep.kubernetes")

LineCallback = Callable[[str], None]


class JobSet:
    """Every object of one run of a rendered app (see the module docstring).

    ``on_line(text)`` receives every line of every pod's main container (the agent already
    prefixes ``[role/rank]``); ``on_finish`` is one of :data:`ON_FINISH`; ``poll_interval``
    the seconds between status reads.
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

    # -- lifecycle ----------------------------------------------------------------------------
    def run(self) -> StepResult:
        """Create, wait, collect, clean up; returns (and keeps in ``result``) the step result.
        Whatever interrupts it (a cancel, an API error, the caller's timeout or signal)
        deletes every object before it propagates."""
        started = time.time()
        try:
            self.create()
            state = self.wait()
            self.result = self.collect(state, started)
            if state == CANCELLED:
                self.delete()  # a cancelled run never keeps pods running, whatever on_finish says
        except BaseException:
            self.delete()  # nothing may keep running
            self._finish_logs()
            raise
        self._finish_logs()  # the last lines of finished pods, before they may be deleted
        if state != CANCELLED and (
            self.on_finish == "delete" or (self.on_finish == "delete_succeeded" and self.result.succeeded)
        ):
            self.delete()
        return self.result

    def cancel(self) -> None:
        """Stop the run (from any thread): ``run`` deletes everything and returns CANCELLED."""
        self._cancel.set()

    def create(self) -> None:
        """Create each role's workload, then its Service owned by it (deleted with it)."""
        for role in self.rendered.roles:
            body = dict(role.workload)
            if body["kind"] == "Job":
                created = self.client.create_namespaced_job(self.ns, body=body)
            else:
                created = self.client.create_namespaced_pod(self.ns, body=body)
            self.log.info("torchstep: created %s %s/%s", body["kind"], self.ns, body["metadata"]["name"])
            if role.service is not None:
                self.client.create_namespaced_service(
                    self.ns, body=owned_by(role.service, self.client.sanitize(created))
                )

    def wait(self) -> str:
        """Poll until every workload finished, one failed, or a cancel; the step's state."""
        while True:
            if self._cancel.is_set():
                return CANCELLED
            states = [self._workload_state(r.kind, r.name) for r in self.rendered.roles]
            self._follow_new_pods()
            if FAILED in states:
                return FAILED
            if all(s == SUCCEEDED for s in states):
                return SUCCEEDED
            self._cancel.wait(self.poll)

    def _workload_state(self, kind: str, name: str) -> str | None:
        if kind == "Job":
            job = self.client.read_namespaced_job_status(name, self.ns)
            for c in _get(job, "status", "conditions") or []:
                if _get(c, "status") == "True" and _get(c, "type") in ("Complete", "SuccessCriteriaMet"):
                    return SUCCEEDED
                if _get(c, "status") == "True" and _get(c, "type") in ("Failed", "FailureTarget"):
                    return FAILED
            return None
        phase = _get(self.client.read_namespaced_pod_status(name, self.ns), "status", "phase")
        return {"Succeeded": SUCCEEDED, "Failed": FAILED}.get(phase)

    # -- logs ---------------------------------------------------------------------------------
    def _pods(self) -> list[Any]:
        return list(
            _get(self.client.list_namespaced_pod(self.ns, label_selector=self.rendered.label_selector), "items")
        )

    def _follow_new_pods(self) -> None:
        for pod in self._pods():
            name = _get(pod, "metadata", "name")
            if name in self._followed or _get(pod, "status", "phase") not in ("Running", "Succeeded", "Failed"):
                continue
            self._followed.add(name)
            t = threading.Thread(target=self._follow, args=(name,), name=f"log-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _follow(self, name: str) -> None:
        """Stream one pod's log to ``on_line``; reattach after a dropped stream (the
        timestamps of the lines already seen tell where to continue)."""
        cursor = _Cursor()
        for attempt in range(MAX_REATTACH + 1):
            if attempt:
                cursor.reattach()
            terminal = self._pod_finished(name)
            try:
                kwargs: dict[str, Any] = {"container": CONTAINER_NAME, "timestamps": True, "_preload_content": False}
                if not terminal:
                    kwargs["follow"] = True
                if cursor.epoch is not None:
                    kwargs["since_seconds"] = max(1, int(time.time() - cursor.epoch) + 2)
                stream = self.client.read_namespaced_pod_log(name, self.ns, **kwargs)
                buf = b""
                for chunk in stream.stream():
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for raw in lines:
                        self._emit(cursor, raw)
                if buf:
                    self._emit(cursor, buf)
            except Exception as e:  # a log stream must never fail the step
                self.log.warning("torchstep: log stream of pod %s dropped: %s", name, e)
            if terminal or self._stop_logs.is_set():
                return
            if attempt:  # a stream that ends at once again and again must not spin
                self._stop_logs.wait(min(self.poll, 1.0))
        self.log.warning("torchstep: gave up following pod %s after %d reattachments", name, MAX_REATTACH)

    def _pod_finished(self, name: str) -> bool:
        """Whether the pod ended (or is gone): its log is then complete and read once more."""
        try:
            phase = _get(self.client.read_namespaced_pod_status(name, self.ns), "status", "phase")
        except Exception:
            return True
        return phase in ("Succeeded", "Failed", None)

    def _emit(self, cursor: _Cursor, raw: bytes) -> None:
        text = cursor.accept(raw.decode("utf-8", "replace").rstrip("\r"))
        if text is None:
            return
        with self._emit_lock:
            try:
                self.on_line(text)
            except Exception as e:  # the caller's callback must not end the stream
                self.log.warning("torchstep: on_line raised %s: %s", type(e).__name__, e)

    def _finish_logs(self) -> None:
        """Let the followers read the last lines of finished pods, then stop them."""
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

    # -- result and cleanup ------------------------------------------------------------------------
    def collect(self, state: str, started: float) -> StepResult:
        """The step result from the latest pod of every replica: its agent's result summary
        (termination message) or, without one, its exit code; merged with ``merge``."""
        by_k8s = {r.role.k8s_name: r.role.name for r in self.rendered.roles}
        order = [r.role.name for r in self.rendered.roles]
        latest: dict[tuple[str, int], Any] = {}
        for pod in sorted(self._pods(), key=lambda p: str(_get(p, "metadata", "creation_timestamp") or "")):
            labels = _get(pod, "metadata", "labels") or {}
            idx = int((_get(pod, "metadata", "annotations") or {}).get(COMPLETION_INDEX, 0))
            latest[(by_k8s.get(labels.get(LABEL_ROLE, ""), "?"), idx)] = pod
        per_replica = [
            self._replica_result(role, idx, pod, state)
            for (role, idx), pod in sorted(latest.items(), key=lambda kv: (_index(order, kv[0][0]), kv[0][1]))
        ]
        merged = merge(self.rendered.app_id, per_replica, started_at=started, ended_at=time.time(), state=state)
        merged.retryable = merged.retryable and state != CANCELLED
        if state == CANCELLED and not merged.message:
            merged.message = "cancelled: every object of the run was deleted"
        return merged

    def _replica_result(self, role: str, idx: int, pod: Any, state: str) -> StepResult:
        code, message = _termination(pod)
        disrupted = any(
            _get(c, "type") == "DisruptionTarget" and _get(c, "status") == "True"
            for c in _get(pod, "status", "conditions") or []
        )
        kind = classify_exit(code, disrupted=disrupted)
        summary = StepResult.from_summary(message)
        if summary is not None:
            rep = ReplicaResult(
                role, idx, summary.state, summary.exit_code, restarts=summary.restarts, message=summary.message
            )
            out = StepResult(
                self.rendered.app_id, summary.state, summary.exit_code, summary.retryable,
                restarts=summary.restarts, root_cause=summary.root_cause, outputs=summary.outputs,
            )  # fmt: skip
        else:
            rep_state = SUCCEEDED if kind is FailureKind.SUCCEEDED else (FAILED if code is not None else state)
            rep = ReplicaResult(role, idx, rep_state, code, message=message)
            out = StepResult(self.rendered.app_id, rep_state, code)
        out.replicas = [rep]
        out.retryable = out.retryable and kind is not FailureKind.NON_RETRYABLE
        if rep.state == FAILED:
            detail = rep.message.strip().splitlines()[-1] if rep.message and rep.message.strip() else ""
            out.message = f"{role}/{idx} exited {code} ({kind.value})" + (f": {detail}" if detail else "")
        else:
            out.message = None
        return out

    def delete(self) -> None:
        """Delete every object of the run: Jobs and Pods with foreground propagation (their
        pods, and the Services they own, go first), then any Service left."""
        sel = self.rendered.label_selector
        calls: list[tuple[str, Callable[[], Any]]] = [
            ("jobs", lambda: self.client.delete_collection_namespaced_job(self.ns, label_selector=sel, propagation_policy="Foreground")),
            ("pods", lambda: self.client.delete_collection_namespaced_pod(self.ns, label_selector=sel, propagation_policy="Foreground")),
            ("services", self._delete_services),
        ]  # fmt: skip
        for what, call in calls:
            try:
                call()
            except Exception as e:  # keep deleting the rest
                self.log.warning("torchstep: cleanup of %s (%s): %s", what, sel, e)

    def _delete_services(self) -> None:
        for svc in _get(
            self.client.list_namespaced_service(self.ns, label_selector=self.rendered.label_selector), "items"
        ):
            self.client.delete_namespaced_service(_get(svc, "metadata", "name"), self.ns)


class _Cursor:
    """Where a pod's log stream is: the newest timestamp emitted and how many lines carried
    it, so a reattached stream (``since_seconds`` overlaps) skips what was already seen."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.at_last = 0
        self.epoch: float | None = None
        self._skip_at_last = 0

    def accept(self, line: str) -> str | None:
        stamp, sep, text = line.partition(" ")
        key = _ts_key(stamp) if sep else None
        if key is None:  # no timestamp (the client did not add one): nothing to dedupe on
            return line
        if self.last is not None:
            if key < self.last:
                return None
            if key == self.last and self._skip_at_last > 0:
                self._skip_at_last -= 1
                return None
        if key == self.last:
            self.at_last += 1
        else:
            self.last, self.at_last = key, 1
            self.epoch = _epoch(stamp)
        return text

    def reattach(self) -> None:
        self._skip_at_last = self.at_last


def _ts_key(stamp: str) -> str | None:
    """An RFC 3339 timestamp as a string that sorts in time order (nanoseconds padded)."""
    if len(stamp) < 20 or stamp[4] != "-" or stamp[10] != "T" or not stamp.endswith("Z"):
        return None
    head, _, frac = stamp[:-1].partition(".")
    return f"{head}.{frac.ljust(9, '0')[:9]}"


def _epoch(stamp: str) -> float | None:
    try:
        from datetime import datetime

        return datetime.fromisoformat(stamp[:19] + "+00:00").timestamp()
    except ValueError:
        return None


def _termination(pod: Any) -> tuple[int | None, str | None]:
    for cs in _get(pod, "status", "container_statuses") or []:
        if _get(cs, "name") == CONTAINER_NAME:
            term = _get(cs, "state", "terminated")
            if term is not None:
                code = _get(term, "exit_code")
                return (int(code) if code is not None else None), _get(term, "message")
    return None, None


def _get(obj: Any, *path: str) -> Any:
    """``obj.a.b`` for API objects and ``obj["a"]["b"]`` for dicts (camelCase keys too)."""
    for key in path:
        if obj is None:
            return None
        if isinstance(obj, dict):
            camel = key.split("_")[0] + "".join(w.title() for w in key.split("_")[1:])
            obj = obj.get(key, obj.get(camel))
        else:
            obj = getattr(obj, key, None)
    return obj


def _index(names: list[str], name: str) -> int:
    return names.index(name) if name in names else len(names)


def _print_line(text: str) -> None:
    print(text, flush=True)
