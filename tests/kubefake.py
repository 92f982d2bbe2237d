"""One recorded fake of the Kubernetes API calls ``torchstep.kubernetes.JobGang`` makes (no
cluster exists on these machines), shared by the core, Airflow, KFP and Prefect tests.

Test code, not product code. Its responses have the shapes of the official client's
objects (attribute access, snake_case fields) for the paths JobGang uses:

- ``create_namespaced_job/pod/service`` store the body and answer it with a ``uid``;
- each replica index gets a pod once its Job exists; a pod runs for ``polls`` status
  reads, then terminates with its scripted exit code and termination message; an index
  scripted with several codes is *replaced* (a new pod, later ``creation_timestamp``)
  after each earlier code, as the Job controller does for ``backoffLimitPerIndex``;
  every pod has its own ``uid`` and, as the Job controller sets it, an ``ownerReferences``
  entry naming its Job (``controller: true``, the Job's uid); a bare Pod is its own;
- :meth:`FakeKube.add_pod` puts a pod there as someone else would (an impostor with the
  run's labels, its own lines and termination message, no owner unless given);
  :meth:`FakeKube.impersonate` makes one with replica 0's labels as soon as the run's
  workload exists (labels are predictable: the same as one made in advance);
- ``read_namespaced_pod_log(follow=True, timestamps=True)`` streams the pod's scripted
  lines with RFC 3339 timestamps; ``drop_after`` makes a stream end early once, as a
  dropped connection does; ``since_seconds`` is honoured (with the overlap a real API
  server gives), so a reattached reader sees some lines again and must skip them;
  ``clock_offset`` puts the node's clock (log timestamps, ``since_seconds``) ahead of
  the watcher's (or behind, negative);
- creating an object whose name exists raises :class:`ApiError` 409 (as the API server's
  AlreadyExists); ``patch_namespaced_job/pod`` merge ``metadata.annotations`` and are
  recorded in ``patches``;
- ``delete_*`` record what was deleted (and with which propagation policy); a delete
  restricted by ``field_selector`` (``metadata.name=...``) is recorded in ``deleted_names``.
"""

from __future__ import annotations

import threading
import time
import types
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any


class ApiError(Exception):
    """An API error with its HTTP status, like the official client's ``ApiException``."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status
        self.reason = reason


def _plain(obj: Any) -> Any:
    """An answer (namespaces) as plain dicts, as ``ApiClient.sanitize_for_serialization``."""
    if isinstance(obj, types.SimpleNamespace):
        return {("apiVersion" if k == "api_version" else k): _plain(v) for k, v in vars(obj).items()}
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


@dataclass
class Script:
    """What replica ``index`` of a Job does: one exit code per incarnation (a replaced pod
    gets the next), the lines it logs, and its termination message per incarnation."""

    codes: list[int] = field(default_factory=lambda: [0])
    lines: list[str] = field(default_factory=list)
    messages: list[str | None] = field(default_factory=list)


class FakeKube:
    """In-memory API server for ``JobGang`` (see the module docstring)."""

    def __init__(
        self,
        scripts: dict[int, Script] | None = None,
        *,
        polls: int = 2,
        drop_after: int | None = None,
        clock_offset: float = 0.0,
    ):
        self.scripts = scripts or {0: Script()}
        self.polls = polls
        self.drop_after = drop_after
        self.clock_offset = clock_offset  # the node's clock minus the watcher's (log times, since_seconds)
        self.started: dict[str, float] = {}  # workload name -> when it was created (its status.startTime)
        self.objects: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, str | None]] = []  # (kind, selector or name, propagation)
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # (kind, name, body)
        self.conflicts = 0
        self.annotations: dict[tuple[str, str], dict[str, str]] = {}  # patched metadata.annotations
        self.log_calls: list[dict[str, Any]] = []
        self.reads = 0
        self.fail_status_reads = 0  # raise on the next N job status reads (an API error)
        self.extra_pods: list[Any] = []  # pods someone else created (add_pod)
        self._impostor: tuple[list[str], str | None] | None = None
        self.extra_lines: dict[str, list[str]] = {}
        self.deleted_names: list[tuple[str, str]] = []  # (kind, field selector) of deletes by name
        self._dropped: set[str] = set()
        self._lock = threading.Lock()

    # -- batch/v1 -------------------------------------------------------------------------------
    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create(body)

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        with self._lock:
            if self.fail_status_reads:
                self.fail_status_reads -= 1
                raise RuntimeError("(500) Internal Server Error")
            self.reads += 1
        stored = next((o for o in self.objects if o["kind"] == "Job" and o["metadata"]["name"] == name), None)
        if stored is None or self._job_deleted():
            raise ApiError(404, f"jobs.batch {name!r} not found")
        meta = ns(
            name=name,
            uid=stored["metadata"]["uid"],
            labels=(stored or {}).get("metadata", {}).get("labels", {}),
            annotations={
                **(stored or {}).get("metadata", {}).get("annotations", {}),
                **self.annotations.get(("Job", name), {}),
            },
        )
        head = {"api_version": "batch/v1", "kind": "Job", "metadata": meta}
        began = self.started.get(name)  # a test may have put the object in place itself: no start
        start = datetime.fromtimestamp(began, tz=UTC) if began is not None else None
        if not self._all_done():
            return ns(**head, status=ns(conditions=[], start_time=start))
        ok = all(s.codes[-1] == 0 for s in self.scripts.values())
        return ns(
            **head, status=ns(conditions=[ns(type="Complete" if ok else "Failed", status="True")], start_time=start)
        )

    def patch_namespaced_job(self, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._patch("Job", name, body)

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._patch("Pod", name, body)

    def delete_collection_namespaced_job(
        self,
        namespace: str,
        label_selector: str,
        propagation_policy: str | None = None,
        field_selector: str | None = None,
    ):
        if field_selector is not None:
            self.deleted_names.append(("jobs", field_selector))
            return
        self.deleted.append(("jobs", label_selector, propagation_policy))

    # -- core/v1 ----------------------------------------------------------------------------------
    def create_namespaced_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create(body)

    def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create(body)

    # -- networking.k8s.io/v1 ---------------------------------------------------------------------
    def create_namespaced_network_policy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._create(body)

    def delete_collection_namespaced_network_policy(self, namespace: str, label_selector: str) -> None:
        self.deleted.append(("networkpolicies", label_selector, None))

    def read_namespaced_pod_status(self, name: str, namespace: str) -> Any:
        if any(o["kind"] == "Pod" and o["metadata"]["name"] == name for o in self.objects):
            with self._lock:
                self.reads += 1  # a bare Pod is its own workload: its status read is the poll
        pod = next((p for p in self._pod_list() if p.metadata.name == name), None)
        if pod is None:
            raise ApiError(404, f"pods {name!r} not found")
        stored = next((o for o in self.objects if o["kind"] == "Pod" and o["metadata"]["name"] == name), None)
        if stored is not None:  # a bare Pod: its own annotations (the saved log cursor)
            extra = {**(stored["metadata"].get("annotations") or {}), **self.annotations.get(("Pod", name), {})}
            pod = ns(
                metadata=ns(**{**vars(pod.metadata), "annotations": {**pod.metadata.annotations, **extra}}),
                status=pod.status,
            )
        return pod

    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        return ns(items=self._pod_list())

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        self.log_calls.append({"name": name, **kwargs})
        if name in self.extra_lines:
            texts = self.extra_lines[name]
        else:
            texts = self._lines(*self._parse(name))
        lines = [f"{_ts(i, self.clock_offset)} {text}" for i, text in enumerate(texts)]
        if "since_seconds" in kwargs:  # second resolution, as the API server: an overlap the reader must skip
            cutoff = int(time.time() + self.clock_offset) - int(kwargs["since_seconds"])
            lines = [line for line in lines if _epoch(line) >= cutoff]
        if self.drop_after is not None and name not in self._dropped and kwargs.get("follow"):
            self._dropped.add(name)
            lines = lines[: self.drop_after]
        payload = [(line + "\n").encode() for line in lines]
        # split lines across chunks: a reader must reassemble them
        chunks = [b"".join(payload)[i : i + 7] for i in range(0, len(b"".join(payload)), 7)]
        return ns(stream=lambda: iter(chunks))

    def delete_collection_namespaced_pod(
        self,
        namespace: str,
        label_selector: str,
        propagation_policy: str | None = None,
        field_selector: str | None = None,
    ):
        if field_selector is not None:
            self.deleted_names.append(("pods", field_selector))
            return
        self.deleted.append(("pods", label_selector, propagation_policy))
        wanted = dict(term.split("=", 1) for term in label_selector.split(",") if "=" in term)
        self.extra_pods = [p for p in self.extra_pods if not wanted.items() <= dict(p.metadata.labels).items()]

    def list_namespaced_service(self, namespace: str, label_selector: str) -> Any:
        return ns(
            items=[
                ns(
                    metadata=ns(
                        name=o["metadata"]["name"],
                        labels=o["metadata"].get("labels", {}),
                        owner_references=[ns(**r) for r in o["metadata"].get("ownerReferences") or []],
                    )
                )
                for o in self.objects
                if o["kind"] == "Service"
            ]
        )

    def add_pod(
        self,
        name: str,
        labels: dict[str, str],
        *,
        lines: list[str],
        message: str | None,
        exit_code: int = 0,
        index: int = 0,
        owner_uid: str | None = None,
    ) -> None:
        """A pod someone else created in the namespace (not by a Job of ours): ``labels``
        (copied from ours, say), its own log ``lines`` and its termination ``message``;
        ``owner_uid`` gives it an ``ownerReferences`` controller entry."""
        refs = (
            [ns(api_version="batch/v1", kind="Job", name="other", uid=owner_uid, controller=True)]
            if owner_uid
            else None
        )
        self.extra_pods.append(
            ns(
                metadata=ns(
                    name=name,
                    uid=f"uid-{name}",
                    labels=dict(labels),
                    owner_references=refs,
                    annotations={"batch.kubernetes.io/job-completion-index": str(index)},
                    creation_timestamp="2026-11-24T00:59:59Z",
                ),
                status=ns(
                    phase="Succeeded" if exit_code == 0 else "Failed",
                    conditions=[],
                    container_statuses=[ns(name="main", state=ns(terminated=ns(exit_code=exit_code, message=message)))],
                ),
            )
        )
        self.extra_lines[name] = list(lines)

    def impersonate(self, lines: list[str], message: str | None) -> None:
        """Once the run's first workload exists, a bare pod ``<workload>-0-evil`` with replica
        0's labels, ``lines`` and the termination ``message`` (a forged result) is there too."""
        self._impostor = (lines, message)

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        self.deleted.append(("service", name, None))

    def sanitize(self, obj: Any) -> dict[str, Any]:
        return _plain(obj)

    # -- the scripted world ------------------------------------------------------------------------
    def _create(self, body: dict[str, Any]) -> dict[str, Any]:
        if any(o["kind"] == body["kind"] and o["metadata"]["name"] == body["metadata"]["name"] for o in self.objects):
            self.conflicts += 1
            raise ApiError(409, "AlreadyExists")
        obj = {**body, "metadata": {**body["metadata"], "uid": f"uid-{len(self.objects)}"}}
        self.objects.append(obj)
        self.started.setdefault(body["metadata"]["name"], time.time())
        if self._impostor is not None and body["kind"] in ("Job", "Pod"):
            lines, message = self._impostor
            self._impostor = None
            labels = (
                body["metadata"]["labels"] if body["kind"] == "Pod" else body["spec"]["template"]["metadata"]["labels"]
            )
            self.add_pod(f"{body['metadata']['name']}-0-evil", labels, lines=lines, message=message)
        return obj

    def _patch(self, kind: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        obj = next((o for o in self.objects if o["kind"] == kind and o["metadata"]["name"] == name), None)
        if obj is None:
            raise ApiError(404, "NotFound")
        self.patches.append((kind, name, body))
        # kept beside the created body, which tests compare with what was rendered
        self.annotations.setdefault((kind, name), {}).update((body.get("metadata") or {}).get("annotations") or {})
        return obj

    def _job(self) -> dict[str, Any] | None:
        """The Job, or a bare Pod standing for a one-replica workload."""
        return next((o for o in self.objects if o["kind"] in ("Job", "Pod")), None)

    def _job_deleted(self) -> bool:
        return any(kind == "jobs" for kind, _, _ in self.deleted)

    def _all_done(self) -> bool:
        return self.reads > self.polls * max(len(s.codes) for s in self.scripts.values())

    def _pod_list(self) -> list[Any]:
        job = self._job()
        if job is None or self._job_deleted() or any(kind == "pods" for kind, _, _ in self.deleted):
            return list(self.extra_pods)
        bare = job["kind"] == "Pod"
        labels = job["metadata"]["labels"] if bare else job["spec"]["template"]["metadata"]["labels"]
        # as the Job controller sets it: the pod's controller is its Job (a bare Pod has no owner)
        owner = (
            None
            if bare
            else [
                ns(
                    api_version="batch/v1",
                    kind="Job",
                    name=job["metadata"]["name"],
                    uid=job["metadata"]["uid"],
                    controller=True,
                    block_owner_deletion=True,
                )
            ]
        )
        pods = []
        for index, script in sorted(self.scripts.items()):
            # incarnation k exists after k * polls reads; it is terminated after (k + 1) * polls
            for k, code in enumerate(script.codes):
                if self.reads < k * self.polls:
                    break
                finished = self.reads > (k + 1) * self.polls
                message = (
                    script.messages[k] if k < len(script.messages) else f"[torchstep-agent] replica {index} exit {code}"
                )
                term = ns(exit_code=code, message=message) if finished else None
                name = job["metadata"]["name"] if bare else f"{job['metadata']['name']}-{index}-{'abcde'[k % 5]}"
                pods.append(
                    ns(
                        metadata=ns(
                            name=name,
                            uid=job["metadata"]["uid"] if bare else f"uid-{name}",
                            labels=labels,
                            owner_references=owner,
                            annotations={"batch.kubernetes.io/job-completion-index": str(index)},
                            creation_timestamp=f"2026-11-24T00:00:{10 * k + index:02d}Z",
                        ),
                        status=ns(
                            phase=("Succeeded" if code == 0 else "Failed") if finished else "Running",
                            conditions=[],
                            container_statuses=[ns(name="main", state=ns(terminated=term))],
                        ),
                    )
                )
        return pods + list(self.extra_pods)

    def _parse(self, name: str) -> tuple[int, int]:
        if any(o["kind"] == "Pod" and o["metadata"]["name"] == name for o in self.objects):
            return 0, 0
        _, index, letter = name.rsplit("-", 2)
        return int(index), "abcde".index(letter)

    def _lines(self, index: int, incarnation: int) -> list[str]:
        script = self.scripts[index]
        return (
            [f"{line} (pod {incarnation})" for line in script.lines] if script.lines else [f"[trainer/{index}] hello"]
        )


#: The fake pods log in the recent past: a reattached reader's since_seconds reaches back there.
_T0 = int(time.time()) - 600


def _ts(i: int, offset: float = 0.0) -> str:
    """RFC 3339 timestamps, increasing; two lines share each one (the reader must count
    them), and half are written without a fraction (as RFC3339Nano trims zeros)."""
    t = _T0 + int(offset) + i // 2
    stamp = datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.5Z" if (i // 2) % 2 else f"{stamp}Z"


def _epoch(line: str) -> int:
    return int(datetime.fromisoformat(line[:19] + "+00:00").timestamp())


class WatcherDies(BaseException):
    """Stands for the process watching a step dying (SIGKILL, OOM, a lost node)."""


class DyingOnce(FakeKube):
    """The API as seen by a watcher that dies once it created the workloads (status reads
    raise :class:`WatcherDies`, its deletes never reach the server), then, after
    ``dead = False``, by the orchestrator's rerun of the step (a working process)."""

    dead = True

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        if self.dead and self.objects:
            raise WatcherDies()
        return super().read_namespaced_job_status(name, namespace)

    def delete_collection_namespaced_job(self, namespace: str, label_selector: str, propagation_policy=None, **kw):
        if not self.dead:
            super().delete_collection_namespaced_job(namespace, label_selector, propagation_policy, **kw)

    def delete_collection_namespaced_pod(self, namespace: str, label_selector: str, propagation_policy=None, **kw):
        if not self.dead:
            super().delete_collection_namespaced_pod(namespace, label_selector, propagation_policy, **kw)

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        if not self.dead:
            super().delete_namespaced_service(name, namespace)

    def delete_collection_namespaced_network_policy(self, namespace: str, label_selector: str) -> None:
        if not self.dead:
            super().delete_collection_namespaced_network_policy(namespace, label_selector)
