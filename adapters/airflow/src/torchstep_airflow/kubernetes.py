"""The kubernetes target of ``AppDefOperator`` (imports the cncf-kubernetes provider and the
Kubernetes client; loaded only when such a task executes).

- One role with one replica, rendered as a bare Pod → a ``KubernetesPodOperator``
  (:class:`StepPodOperator`) runs exactly the pod ``torchstep.kubernetes.render`` made: its
  logs stream into the task log, the agent writes the step result to
  ``/airflow/xcom/return.json`` and the operator's XCom sidecar reads it back;
  ``on_finish_action``, ``deferrable`` and every other KPO argument work as usual
  (``kubernetes_kwargs``).
- Anything else (several replicas or roles) → core's :class:`torchstep.steps.KubernetesStep`
  (``JobSet``) with the ``KubernetesHook``'s client; every pod's log goes to the task log,
  ``on_finish_action`` maps to ``on_finish``. Not deferrable.

Example::

    AppDefOperator(task_id="train", app=trainer, target="kubernetes",
                   cfg={"namespace": "ml", "service_account": "trainer"},
                   kubernetes_kwargs={"kubernetes_conn_id": "gke", "on_finish_action": "delete_succeeded_pod"})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from torchstep.contract import NON_RETRYABLE_EXIT_CODE
from torchstep.errors import SpecError
from torchstep.kubernetes import CONTAINER_NAME, OfficialClient, RenderedApp
from torchstep.result import FAILED, StepResult
from torchstep.spec.model import StepPlan
from torchstep.steps import KubernetesStep as CoreKubernetesStep

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
#: KubernetesPodOperator's ``on_finish_action`` → core's ``JobSet`` ``on_finish``.
ON_FINISH = {"delete_pod": "delete", "delete_succeeded_pod": "delete_succeeded", "keep_pod": "keep"}


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
        self.kwargs = dict(kwargs)
        self.log = log
        self.result: StepResult | None = None
        # the agent writes its result where KubernetesPodOperator's XCom sidecar reads it
        self.core = CoreKubernetesStep(
            plan, run_id=run_id, cfg=cfg, result_file=XCOM_RESULT_FILE,
            poll_interval=float(self.kwargs.get("poll_interval", 2.0)), on_finish=_on_finish(self.kwargs),
        )  # fmt: skip
        self.rendered: RenderedApp = self.core.rendered
        self._inner: StepPodOperator | None = None
        if is_single_pod(self.rendered):
            self._inner = pod_operator(task_id, self.rendered, self.kwargs)
            return
        bad = sorted(set(self.kwargs) - JOB_ARGS)
        if bad:
            raise SpecError(
                f"kubernetes_kwargs[{bad[0]!r}]",
                TARGET,
                "only a 1-replica, 1-role app runs as a KubernetesPodOperator; this app runs as Jobs",
                fix=f"use only {', '.join(sorted(JOB_ARGS))}",
            )
        conn = {k: v for k, v in self.kwargs.items() if k in ("in_cluster", "config_file", "cluster_context")}
        self.hook = KubernetesHook(
            conn_id=self.kwargs.get("kubernetes_conn_id", KubernetesHook.default_conn_name), **conn
        )

    def run(self, context: Any) -> StepResult:
        if self._inner is None:
            if self.core.client is None:
                hook = self.hook
                self.core.client = OfficialClient(
                    core=hook.core_v1_client, batch=hook.batch_v1_client, api_client=hook.api_client
                )
            self.result = self.core.run()
            return self.result
        op = self._inner
        return self._from_pod(lambda: _nested(op, op.execute, context))

    def resume(self, context: Any, event: dict[str, Any]) -> StepResult:
        """Back from deferral (deferrable KubernetesPodOperator)."""
        op = self._inner
        assert op is not None
        return self._from_pod(lambda: _nested(op, op.trigger_reentry, context, event))

    def _from_pod(self, call: Any) -> StepResult:
        op = self._inner
        assert op is not None
        try:
            call()
        except Exception as e:
            if op.step_result is not None:  # KPO's "pod failed" (or a cleanup error): the result says more
                self.log.warning("torchstep: the pod operator raised %s; reporting the agent's result", e)
            else:
                code = _exit_code(op.final_pod)
                if code == NON_RETRYABLE_EXIT_CODE:
                    self.result = StepResult(app_id=self.rendered.app_id, state=FAILED, exit_code=code, retryable=False,
                                             message="the agent exited non-retryable (82); no result file")  # fmt: skip
                    return self.result
                raise
        if op.step_result is None:
            raise SpecError("result_file", TARGET, "the pod finished without a step result", fix="check the pod log")
        self.result = StepResult.from_dict(op.step_result)
        return self.result

    def cancel(self) -> None:
        if self._inner is not None:
            self._inner.on_kill()
        else:
            self.core.cancel()


def _on_finish(kwargs: Mapping[str, Any]) -> str:
    action = kwargs.get("on_finish_action", "delete_pod")
    if action not in ON_FINISH:
        raise SpecError(
            "kubernetes_kwargs['on_finish_action']", TARGET, f"unknown {action!r}", fix=f"one of {tuple(ON_FINISH)}"
        )
    return ON_FINISH[action]


def _exit_code(pod: Any) -> int | None:
    for cs in getattr(getattr(pod, "status", None), "container_statuses", None) or []:
        if cs.name == CONTAINER_NAME and cs.state and cs.state.terminated:
            return int(cs.state.terminated.exit_code)
    return None
