"""The kubernetes target of ``AppDefOperator`` (imports the cncf-kubernetes provider and the
Kubernetes client; loaded only when such a task executes).

- One role with one replica, rendered as a bare Pod → a ``KubernetesPodOperator``
  (:class:`StepPodOperator`) runs exactly the pod ``torchstep.kubernetes.render`` made: its
  logs stream into the task log, the agent writes the step result to
  ``/airflow/xcom/return.json`` and the operator's XCom sidecar reads it back;
  ``on_finish_action``, ``deferrable`` and every other KPO argument work as usual
  (``kubernetes_kwargs``).
- Anything else (several replicas or roles) → :class:`JobSet`: the rendered Indexed Jobs,
  headless Services (owned by their Job) and Pods are created through the provider's
  ``KubernetesHook``, every pod's log is streamed, the run is waited on, the result is
  built from the pods' exit codes and termination messages, and the objects are deleted
  according to ``on_finish_action``. Not deferrable.

Example::

    AppDefOperator(task_id="train", app=trainer, target="kubernetes",
                   cfg={"namespace": "ml", "service_account": "trainer"},
                   kubernetes_kwargs={"kubernetes_conn_id": "gke", "on_finish_action": "delete_succeeded_pod"})
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from torchstep.errors import NON_RETRYABLE_EXIT_CODE, SpecError
from torchstep.kubernetes import (
    CONTAINER_NAME,
    LABEL_ROLE,
    FailureKind,
    RenderedApp,
    classify_exit,
    owned_by,
    render_app,
)
from torchstep.result import CANCELLED, FAILED, SUCCEEDED, RankResult, ReplicaResult, StepResult
from torchstep.spec.model import StepPlan

TARGET = "kubernetes"
#: Where the agent writes the step result in a KubernetesPodOperator pod (its XCom file).
XCOM_RESULT_FILE = "/airflow/xcom/return.json"
#: KubernetesPodOperator arguments torchstep sets from the rendered pod.
OWNED_POD_ARGS = frozenset(
    {
        "task_id", "full_pod_spec", "pod_template_file", "pod_template_dict", "namespace", "name",
        "random_name_suffix", "base_container_name", "do_xcom_push", "image", "cmds", "arguments", "env_vars",
        "env_from", "secrets", "volumes", "volume_mounts", "container_resources", "ports", "node_selector",
        "image_pull_secrets", "service_account_name", "priority_class_name", "termination_message_policy",
        "active_deadline_seconds", "subdomain",
    }
)  # fmt: skip
#: What the Job path takes from ``kubernetes_kwargs``.
JOB_ARGS = frozenset(
    {"kubernetes_conn_id", "in_cluster", "config_file", "cluster_context", "on_finish_action", "poll_interval"}
)
ON_FINISH = ("delete_pod", "delete_succeeded_pod", "keep_pod")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def render_for(plan: StepPlan, *, run_id: str, cfg: Mapping[str, Any]) -> RenderedApp:
    """The objects of one try: names from the Airflow run id, the agent's result written
    where KubernetesPodOperator's XCom sidecar reads it."""
    cfg = dict(cfg)
    if cfg.get("run_id") not in (None, run_id):
        raise SpecError("cfg['run_id']", TARGET, "the run id is set by Airflow (per task try)", fix="remove it")
    cfg["run_id"] = run_id
    cfg.setdefault("result_file", XCOM_RESULT_FILE)
    return render_app(plan, cfg=cfg)


def is_single_pod(rendered: RenderedApp) -> bool:
    return len(rendered.roles) == 1 and rendered.roles[0].kind == "Pod" and rendered.roles[0].service is None


class StepPodOperator(KubernetesPodOperator):
    """A KubernetesPodOperator running one rendered torchstep pod; it keeps the agent's
    result (read by the XCom sidecar) and the finished pod for the adapter."""

    step_result: dict[str, Any] | None = None
    final_pod: Any = None

    def extract_xcom(self, pod: Any) -> dict[Any, Any] | None:
        self.step_result = super().extract_xcom(pod)
        return self.step_result

    def cleanup(self, pod: Any, remote_pod: Any) -> Any:
        self.final_pod = remote_pod
        return super().cleanup(pod, remote_pod)


def pod_operator(task_id: str, rendered: RenderedApp, kwargs: Mapping[str, Any]) -> StepPodOperator:
    """The KubernetesPodOperator of a 1-role, 1-replica app (``kwargs``: KPO arguments)."""
    owned = sorted(set(kwargs) & OWNED_POD_ARGS)
    if owned:
        raise SpecError(
            f"kubernetes_kwargs[{owned[0]!r}]",
            TARGET,
            "torchstep sets this from the AppDef",
            fix="change the AppDef (or cfg) instead; `torchstep explain` shows what each field becomes",
        )
    role = rendered.roles[0]
    return StepPodOperator(
        task_id=task_id,
        full_pod_spec=PodGenerator.deserialize_model_dict(role.pod),
        namespace=rendered.namespace,
        name=role.name,
        random_name_suffix=False,  # the name is unique per try already (hash of the run id)
        base_container_name=CONTAINER_NAME,
        do_xcom_push=True,
        termination_message_policy="FallbackToLogsOnError",
        **{"get_logs": True, "log_events_on_failure": True, **kwargs},
    )


def _nested(op: Any, method: Any, *args: Any, **kwargs: Any) -> Any:
    """Call an inner operator's method as the task runner would (no "called outside of the
    Task Runner" warning for an operator we compose)."""
    try:
        from airflow.sdk.bases.operator import ExecutorSafeguard

        token = ExecutorSafeguard.tracker.set(op)
    except (ImportError, AttributeError):  # pragma: no cover - other Airflow versions
        return method(*args, **kwargs)
    try:
        return method(*args, **kwargs)
    finally:
        ExecutorSafeguard.tracker.reset(token)


class KubernetesStep:
    """One try of an AppDef on Kubernetes (see the module docstring)."""

    def __init__(
        self, task_id: str, plan: StepPlan, *, run_id: str, cfg: Mapping[str, Any], kwargs: Mapping[str, Any], log: Any
    ) -> None:
        self.rendered = render_for(plan, run_id=run_id, cfg=cfg)
        self.kwargs = dict(kwargs)
        self.log = log
        self.result: StepResult | None = None
        self._inner: StepPodOperator | JobSet
        if is_single_pod(self.rendered):
            self._inner = pod_operator(task_id, self.rendered, self.kwargs)
        else:
            bad = sorted(set(self.kwargs) - JOB_ARGS)
            if bad:
                raise SpecError(
                    f"kubernetes_kwargs[{bad[0]!r}]",
                    TARGET,
                    "only a 1-replica, 1-role app runs as a KubernetesPodOperator; this app runs as Jobs",
                    fix=f"use only {', '.join(sorted(JOB_ARGS))}",
                )
            self._inner = JobSet(self.rendered, self.kwargs, log)

    def run(self, context: Any) -> StepResult:
        if isinstance(self._inner, JobSet):
            self.result = self._inner.run()
            return self.result
        return self._from_pod(lambda: _nested(self._inner, self._inner.execute, context))

    def resume(self, context: Any, event: dict[str, Any]) -> StepResult:
        """Back from deferral (deferrable KubernetesPodOperator)."""
        assert isinstance(self._inner, StepPodOperator)
        op = self._inner
        return self._from_pod(lambda: _nested(op, op.trigger_reentry, context, event))

    def _from_pod(self, call: Any) -> StepResult:
        op = self._inner
        assert isinstance(op, StepPodOperator)
        try:
            call()
        except Exception as e:
            if op.step_result is not None:  # KPO's "pod failed" (or a cleanup error): the result says more
                self.log.warning("torchstep: the pod operator raised %s; reporting the agent's result", e)
            else:
                code = _exit_code(op.final_pod)
                if code == NON_RETRYABLE_EXIT_CODE:
                    self.result = _status_result(self.rendered, FAILED, code, retryable=False,
                                                 message="the agent exited non-retryable (82); no result file")  # fmt: skip
                    return self.result
                raise
        if op.step_result is None:
            raise SpecError("result_file", TARGET, "the pod finished without a step result", fix="check the pod log")
        self.result = StepResult.from_dict(op.step_result)
        return self.result

    def cancel(self) -> None:
        self._inner.on_kill() if isinstance(self._inner, StepPodOperator) else self._inner.cancel()


def _exit_code(pod: Any) -> int | None:
    for cs in getattr(getattr(pod, "status", None), "container_statuses", None) or []:
        if cs.name == CONTAINER_NAME and cs.state and cs.state.terminated:
            return int(cs.state.terminated.exit_code)
    return None


def _status_result(rendered: RenderedApp, state: str, code: int | None, *, retryable: bool, message: str) -> StepResult:
    return StepResult(app_id=rendered.app_id, state=state, exit_code=code, retryable=retryable, message=message)


class JobSet:
    """Every object of a multi-replica / multi-role run, created, watched and cleaned up
    through the provider's KubernetesHook."""

    def __init__(self, rendered: RenderedApp, kwargs: Mapping[str, Any], log: Any) -> None:
        self.rendered = rendered
        self.ns = rendered.namespace
        self.on_finish = kwargs.get("on_finish_action", "delete_pod")
        if self.on_finish not in ON_FINISH:
            raise SpecError(
                "kubernetes_kwargs['on_finish_action']",
                TARGET,
                f"unknown {self.on_finish!r}",
                fix=f"one of {ON_FINISH}",
            )
        self.poll = float(kwargs.get("poll_interval", 2.0))
        conn = {k: v for k, v in kwargs.items() if k in ("in_cluster", "config_file", "cluster_context")}
        self.hook = KubernetesHook(conn_id=kwargs.get("kubernetes_conn_id", KubernetesHook.default_conn_name), **conn)
        self.log = log
        self._cancel = threading.Event()
        self._followed: set[str] = set()
        self._threads: list[threading.Thread] = []

    # -- lifecycle ----------------------------------------------------------------------------
    def run(self) -> StepResult:
        started = time.time()
        try:
            self.create()
            state = self.wait()
        except BaseException:
            self.delete()  # timeout, kill or an API error: nothing may keep running
            raise
        result = self.collect(state, started)
        if self.on_finish == "delete_pod" or (self.on_finish == "delete_succeeded_pod" and result.succeeded):
            self.delete()
        for t in self._threads:
            t.join(timeout=5)
        return result

    def cancel(self) -> None:
        self._cancel.set()

    def create(self) -> None:
        core, batch = self.hook.core_v1_client, self.hook.batch_v1_client
        for role in self.rendered.roles:
            wl = dict(role.workload)
            if wl["kind"] == "Job":
                created = batch.create_namespaced_job(self.ns, body=wl)
            else:
                created = core.create_namespaced_pod(self.ns, body=wl)
            self.log.info("torchstep: created %s %s/%s", wl["kind"], self.ns, wl["metadata"]["name"])
            if role.service is not None:
                owner = self.hook.api_client.sanitize_for_serialization(created)
                core.create_namespaced_service(self.ns, body=owned_by(role.service, owner))

    def wait(self) -> str:
        """Poll until every workload has finished (or one failed, or a cancel); the state."""
        while True:
            if self._cancel.is_set():
                self.delete()
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
            job = self.hook.batch_v1_client.read_namespaced_job_status(name, self.ns)
            for c in job.status.conditions or []:
                if c.status == "True" and c.type in ("Complete", "SuccessCriteriaMet"):
                    return SUCCEEDED
                if c.status == "True" and c.type in ("Failed", "FailureTarget"):
                    return FAILED
            return None
        phase = self.hook.core_v1_client.read_namespaced_pod_status(name, self.ns).status.phase
        return {"Succeeded": SUCCEEDED, "Failed": FAILED}.get(phase)

    # -- logs ---------------------------------------------------------------------------------
    def _pods(self) -> list[Any]:
        return list(
            self.hook.core_v1_client.list_namespaced_pod(self.ns, label_selector=self.rendered.label_selector).items
        )

    def _follow_new_pods(self) -> None:
        for pod in self._pods():
            name = pod.metadata.name
            if name in self._followed or pod.status.phase not in ("Running", "Succeeded", "Failed"):
                continue
            self._followed.add(name)
            t = threading.Thread(target=self._follow, args=(name,), name=f"log-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _follow(self, name: str) -> None:
        try:
            stream = self.hook.core_v1_client.read_namespaced_pod_log(
                name, self.ns, container=CONTAINER_NAME, follow=True, _preload_content=False
            )
            buf = b""
            for chunk in stream.stream():
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    print(line.decode(errors="replace"), flush=True)  # the agent prefixes [role/rank]
            if buf:
                print(buf.decode(errors="replace"), flush=True)
        except Exception as e:  # a log stream must never fail the step
            self.log.warning("torchstep: log stream of pod %s ended: %s", name, e)

    # -- result and cleanup ------------------------------------------------------------------------
    def collect(self, state: str, started: float) -> StepResult:
        """The step result from the pods: per replica its agent's exit code and message."""
        by_k8s = {r.role.k8s_name: r.role.name for r in self.rendered.roles}
        latest: dict[tuple[str, int], Any] = {}
        for pod in sorted(self._pods(), key=lambda p: p.metadata.creation_timestamp or 0):
            labels = pod.metadata.labels or {}
            idx = int((pod.metadata.annotations or {}).get(COMPLETION_INDEX, 0))
            latest[(by_k8s.get(labels.get(LABEL_ROLE, ""), "?"), idx)] = pod
        replicas: list[ReplicaResult] = []
        retryable, failure = True, None
        roots: list[RankResult] = []
        outputs: dict[str, Any] = {}
        role_order = [r.role.name for r in self.rendered.roles]
        for (role, idx), pod in sorted(latest.items(), key=lambda kv: (_order(role_order, kv[0][0]), kv[0][1])):
            code = _exit_code(pod)
            disrupted = any(c.type == "DisruptionTarget" and c.status == "True" for c in pod.status.conditions or [])
            kind = classify_exit(code, disrupted=disrupted)
            message = _termination_message(pod)
            # the agent writes its final result summary as the termination message (outputs included)
            summary = StepResult.from_summary(message)
            rep_state = SUCCEEDED if kind is FailureKind.SUCCEEDED else (FAILED if code is not None else state)
            if summary is not None:
                rep = ReplicaResult(role, idx, summary.state, summary.exit_code, restarts=summary.restarts,
                                    message=summary.message)  # fmt: skip
                retryable &= summary.retryable
                if summary.root_cause is not None:
                    roots.append(summary.root_cause)
                if summary.outputs and not outputs:  # the first role's replica 0 holds global rank 0
                    outputs = summary.outputs
            else:
                rep = ReplicaResult(role, idx, rep_state, code, message=message)
            replicas.append(rep)
            retryable &= kind is not FailureKind.NON_RETRYABLE
            if rep.state == FAILED and failure is None:
                detail = rep.message.strip().splitlines()[-1] if rep.message and rep.message.strip() else ""
                failure = f"{role}/{idx} exited {code} ({kind.value})" + (f": {detail}" if detail else "")
        ended = time.time()
        exit_code = 0 if state == SUCCEEDED else next((r.exit_code for r in replicas if r.exit_code), None)
        root = min(roots, key=lambda r: (r.timestamp is None, r.timestamp or 0.0)) if roots else None
        return StepResult(
            app_id=self.rendered.app_id, state=state, exit_code=exit_code, retryable=retryable and state != CANCELLED,
            restarts=sum(r.restarts for r in replicas), duration_s=ended - started, started_at=started,
            ended_at=ended, replicas=replicas, message=failure, root_cause=root, outputs=outputs,
        )  # fmt: skip

    def delete(self) -> None:
        """Delete every object of the run (Jobs with their pods, Pods, Services)."""
        core, batch, sel = self.hook.core_v1_client, self.hook.batch_v1_client, self.rendered.label_selector
        for call in (
            lambda: batch.delete_collection_namespaced_job(self.ns, label_selector=sel, propagation_policy="Background"),
            lambda: core.delete_collection_namespaced_pod(self.ns, label_selector=sel),
            lambda: [core.delete_namespaced_service(s.metadata.name, self.ns) for s in core.list_namespaced_service(self.ns, label_selector=sel).items],
        ):  # fmt: skip
            try:
                call()
            except Exception as e:  # keep deleting the rest
                self.log.warning("torchstep: cleanup of %s: %s", sel, e)


def _order(names: list[str], name: str) -> int:
    return names.index(name) if name in names else len(names)


def _termination_message(pod: Any) -> str | None:
    for cs in pod.status.container_statuses or []:
        if cs.name == CONTAINER_NAME and cs.state and cs.state.terminated:
            return cs.state.terminated.message
    return None
