"""The kubernetes target of ``AppDefOperator`` (imports the cncf-kubernetes provider and the
Kubernetes client; loaded only when such a task executes).

- One role with one replica, rendered as a bare Pod → :class:`PodStep`, a
  :class:`~torchstep.adapter.StepBackend` (the seam's protocol: ``run``, ``cancel``, ``say``,
  ``record``) whose ``run`` is a ``KubernetesPodOperator``
  (:class:`StepPodOperator`) running exactly the pod ``torchstep.kubernetes.render`` made: its
  logs stream into the task log, the agent writes the step result to
  ``/airflow/xcom/return.json`` and the operator's XCom sidecar reads it back;
  ``on_finish_action``, ``deferrable`` and every other KPO argument work as usual
  (``kubernetes_kwargs``).
- Anything else (several replicas or roles) → core's :func:`torchstep.steps.open_step` with
  the ``KubernetesHook``'s client; every pod's log goes to the task log,
  ``on_finish_action`` maps to ``on_finish``. Deferrable (``AppDefOperator(deferrable=True)``):
  the worker creates the Jobs, the task waits in the triggerer
  (:class:`torchstep_airflow.triggers.JobGangTrigger`), and ``execute_complete`` reattaches
  in a worker to print the logs, collect and clean up (:func:`defer_jobs`, :func:`resume_jobs`).

Durable (``durable=True``, the default of ``AppDefOperator``): a retry after the worker died
reattaches instead of starting a second pod or gang. The pod path relies on the
KubernetesPodOperator's own ``reattach_on_restart`` (it finds the earlier try's pod by the
task's labels); the Job path goes through :mod:`torchstep_airflow.durable` (Airflow's
``ResumableJobMixin`` and the task state store) to core's attach-or-create.

A pod is this task's by uid, not by labels (:mod:`torchstep.kubernetes.ownership`): the pod
path records the uid of the pod it creates in the task state store at once, follows and
reads only that pod, and reattaches only to a pod whose uid a try of this task recorded;
any other pod carrying the task's labels is ignored and reported once in the task log. The
Job path does the same through core's step (the store is its ``cursor_store``).

Example::

    AppDefOperator(task_id="train", app=trainer, target="kubernetes",
                   cfg={"namespace": "ml", "service_account": "trainer"},
                   kubernetes_kwargs={"kubernetes_conn_id": "gke", "on_finish_action": "delete_succeeded_pod"})
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.sdk.exceptions import AirflowException
from torchstep import NON_RETRYABLE_EXIT_CODE, RunError, SpecError, StepPlan, StepResult, StepState
from torchstep.adapter import FAILED, SUCCEEDED, open_step, run_tries
from torchstep.adapter.kubernetes import (
    CONTAINER_NAME,
    OfficialClient,
    Preemptions,
    RemoteRun,
    RenderedApp,
    disruption,
    handle_of,
    impostor_warning,
    record_uid,
    recorded_uids,
    render_app,
    termination,
    uid_of,
    wait_until_gone,
)

from torchstep_airflow.settings import attempt_of

TARGET = "kubernetes"
#: Where the agent writes the step result in a KubernetesPodOperator pod (its XCom file).
XCOM_RESULT_FILE = "/airflow/xcom/return.json"
#: The keyword under which a deferred pod run carries torchstep's state of the try through
#: the deferral (Airflow's ``next_kwargs``, kept with the task instance: it survives the
#: worker): the pod's uid and resourceVersion and the pods counted as preempted.
DEFERRAL_KWARG = "torchstep_pod"
#: The same state in the task state store (Airflow 3.3+), keyed by the try's pod name: what
#: resumes a deferral whose keywords were not kept (``dag.test()`` keeps only the event).
DEFERRAL_STATE_KEY = "torchstep_pod_deferral"
#: Seconds a watch may take to replay how a pod that is already gone ended.
GONE_WATCH_S = 5
#: KubernetesPodOperator arguments torchstep sets from the rendered pod.
OWNED_POD_ARGS = frozenset(
    {
        "task_id",
        "full_pod_spec",
        "pod_template_file",
        "pod_template_dict",
        "namespace",
        "name",
        "random_name_suffix",
        "base_container_name",
        "do_xcom_push",
        "image",
        "cmds",
        "arguments",
        "env_vars",
        "env_from",
        "secrets",
        "volumes",
        "volume_mounts",
        "container_resources",
        "ports",
        "node_selector",
        "image_pull_secrets",
        "service_account_name",
        "priority_class_name",
        "termination_message_policy",
        "active_deadline_seconds",
        "subdomain",
    }
)
#: What the Job path takes from ``kubernetes_kwargs``.
JOB_ARGS = frozenset(
    {"kubernetes_conn_id", "in_cluster", "config_file", "cluster_context", "on_finish_action", "poll_interval"}
)
#: KubernetesPodOperator's ``on_finish_action`` → core's ``JobGang`` ``on_finish``.
ON_FINISH = {"delete_pod": "delete", "delete_succeeded_pod": "delete_succeeded", "keep_pod": "keep"}


def is_single_pod(rendered: RenderedApp) -> bool:
    return len(rendered.roles) == 1 and rendered.roles[0].kind == "Pod" and rendered.roles[0].service is None


class StepPodOperator(KubernetesPodOperator):
    """A KubernetesPodOperator running one rendered torchstep pod; it keeps the agent's
    result (read by the XCom sidecar) and the finished pod for the adapter, and uses only
    the pod it created (or, reattaching, one a try of this task recorded): see the module
    docstring."""

    step_result: dict[str, Any] | None = None
    result: StepResult | None = None  # a stopped pod leaves no result here (see AppDefOperator)
    final_pod: Any = None
    pod_uid: str | None = None  # the uid of the pod this execution created or reattached to
    pod_version: str | None = None  # that pod's resourceVersion when created or found
    carry: Callable[[], dict[str, Any]] | None = None  # what a deferral keeps (PodStep's state)
    _ignored: frozenset[str] = frozenset()

    def defer(
        self, *, trigger: Any, method_name: str, kwargs: dict[str, Any] | None = None, timeout: Any = None
    ) -> NoReturn:
        """KubernetesPodOperator's deferral, with torchstep's state of the try (``carry``)
        in the resume's keywords (:data:`DEFERRAL_KWARG`), so the preemptions counted so far
        and the pod's uid survive the wait in the triggerer.

        Raises:
            TaskDeferred: always.
        """
        extra = {DEFERRAL_KWARG: self.carry()} if self.carry is not None else {}
        super().defer(trigger=trigger, method_name=method_name, kwargs={**(kwargs or {}), **extra}, timeout=timeout)

    def cancel(self) -> None:
        """Stop the step (the pod): what a core step's ``cancel`` is to ``AppDefOperator``."""
        self.on_kill()

    def extract_xcom(self, pod: Any) -> dict[Any, Any] | None:
        self.step_result = super().extract_xcom(pod)
        return self.step_result

    def cleanup(self, pod: Any, remote_pod: Any) -> Any:
        self.final_pod = remote_pod
        return super().cleanup(pod, remote_pod)

    def get_or_create_pod(self, pod_request_obj: Any, context: Any) -> Any:
        """KubernetesPodOperator's, recording the created pod's uid in the task state store
        before anything else happens (a retry reattaches only to a recorded pod)."""
        if self.reattach_on_restart:
            pod = self.find_pod(pod_request_obj.metadata.namespace, context=context)
            if pod is not None:
                return pod
        created = self.pod_manager.create_pod(pod=pod_request_obj)
        self.pod_uid = uid_of(created)
        self.pod_version = getattr(created.metadata, "resource_version", None)
        store = _store(context)
        if self.pod_uid is None:
            raise RunError(
                f"Pod {pod_request_obj.metadata.namespace}/{pod_request_obj.metadata.name}",
                "the API server answered its creation without a uid; fix: check the Kubernetes API",
            )
        if store is not None and self.reattach_on_restart:
            record_uid(store, pod_request_obj.metadata.name, self.pod_uid)
        return pod_request_obj

    def find_pod(self, namespace: str, context: Any, *, exclude_checked: bool = True) -> Any:
        """The pod of this task among those carrying its labels: the one this execution
        created, else (reattaching) one whose uid a try of this task recorded. Without a
        task state store and before creating, KubernetesPodOperator's own choice by labels
        (Airflow < 3.3: docs/security.md)."""
        store = _store(context)
        if self.pod_uid is None and store is None:
            return super().find_pod(namespace, context, exclude_checked=exclude_checked)
        trusted = {self.pod_uid} if self.pod_uid is not None else set(recorded_uids(store).values())
        selector = self._build_find_pod_label_selector(context, exclude_checked=exclude_checked)
        ours = []
        for pod in self.client.list_namespaced_pod(namespace=namespace, label_selector=selector).items:
            if uid_of(pod) in trusted:
                ours.append(pod)
            elif pod.metadata.name not in self._ignored:
                self._ignored = self._ignored | {pod.metadata.name}
                why = f"this task did not create it (uid {uid_of(pod)})"
                self.log.warning("%s", impostor_warning(namespace, pod.metadata.name, selector, why))
        if not ours:
            return None
        if len(ours) > 1 and self.reattach_on_restart:  # two tries' pods both unreported: KPO's own rule
            raise AirflowException(f"More than one pod running with labels {selector}")
        pod = ours[0] if len(ours) == 1 else self.process_duplicate_label_pods(ours)
        self.log_matching_pod(pod=pod, context=context)
        self.pod_uid = uid_of(pod)
        self.pod_version = getattr(pod.metadata, "resource_version", None)
        return pod


def _store(context: Any) -> Any:
    """The task state store of ``context`` (Airflow 3.3+), else ``None``."""
    return context.get("task_state_store") if context is not None else None


def pod_operator(
    task_id: str, rendered: RenderedApp, kwargs: Mapping[str, Any], *, durable: bool = True
) -> StepPodOperator:
    """The KubernetesPodOperator of a 1-role, 1-replica app (``kwargs``: KPO arguments).

    ``durable`` is KPO's ``reattach_on_restart``: a retry finds the earlier try's pod by the
    task's labels (dag, task, run and map index, not the try) unless that try reported it
    (KPO labels a pod it has seen finish ``already_checked``), so it reattaches to a pod
    whose watcher died, even one that finished meanwhile, and never starts a second one."""
    owned = sorted(set(kwargs) & OWNED_POD_ARGS)
    if owned:
        raise SpecError(
            f"kubernetes_kwargs[{owned[0]!r}]",
            TARGET,
            "torchstep sets this from the AppDef",
            fix="change the AppDef (or cfg) instead; `torchstep explain` shows what each field becomes",
        )
    if kwargs.get("reattach_on_restart", durable) != durable:
        raise SpecError(
            "kubernetes_kwargs['reattach_on_restart']",
            TARGET,
            f"contradicts durable={durable} (durable is the pod operator's reattach_on_restart)",
            fix="set only durable on the AppDefOperator",
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
        **{"get_logs": True, "log_events_on_failure": True, **kwargs, "reattach_on_restart": durable},
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


def render(task: Any, plan: StepPlan, run_id: str) -> RenderedApp:
    """The objects of ``task``'s try ``run_id``; the agent writes its result where
    KubernetesPodOperator's XCom sidecar reads it."""
    return render_app(plan, cfg={**task.cfg, "run_id": run_id, "result_file": XCOM_RESULT_FILE})


def run_kubernetes(task: Any, plan: StepPlan, context: Any, event: dict[str, Any] | None = None) -> StepResult:
    """One try of ``task`` (an ``AppDefOperator``) on Kubernetes: a 1-replica app through
    :class:`StepPodOperator` (``event``: back from its deferral), anything else as Jobs
    through :func:`torchstep.steps.open_step` (durably: :mod:`torchstep_airflow.durable`).
    Every step it opens goes through ``task.use_step`` (so ``on_kill`` stops it)."""
    kwargs = task.kubernetes_kwargs
    rendered = render(task, plan, attempt_of(context).run_id)
    note = queue_timeout_note(task.cfg.get("queue"), task.execution_timeout)
    if note is not None:
        task.log.warning("%s", note)
    resumed = event is not None and bool(event.get("resumed_jobs"))
    if is_single_pod(rendered) and task.own_retries == 0 and not resumed:  # the generic DAG retries inside
        return task.use_step(PodStep(task, plan, rendered, context, event)).run()
    bad = sorted(set(kwargs) - JOB_ARGS)
    if bad:
        raise SpecError(
            f"kubernetes_kwargs[{bad[0]!r}]",
            TARGET,
            "only a 1-replica, 1-role app runs as a KubernetesPodOperator; this app runs as Jobs",
            fix=f"use only {', '.join(sorted(JOB_ARGS))}",
        )
    on_finish = _on_finish(kwargs)
    client = job_client(kwargs)
    options = {
        "cfg": task.cfg,
        "client": client,
        "result_file": XCOM_RESULT_FILE,
        "on_finish": on_finish,
        "poll_interval": float(kwargs.get("poll_interval", 2.0)),
    }

    def open_try(attempt: Any, cursor_store: Any = None) -> Any:
        return task.use_step(open_step(plan, attempt=attempt, cursor_store=cursor_store, **options))

    if resumed:
        assert event is not None
        return resume_jobs(task, open_try, event, context)
    defer = None
    if task.deferrable and task.own_retries == 0:  # (the generic DAG retries inside one try: it waits here)

        def defer(step: Any) -> None:
            defer_jobs(task, step, context, float(options["poll_interval"]))

    if not task.durable:
        if defer is not None:
            step = open_try(attempt_of(context))
            defer(step)
            return step.run()  # type: ignore[no-any-return]
        return run_tries(
            plan,
            attempt=attempt_of(context),
            retries=task.own_retries,
            on_step=task.use_step,
            on_retry=task.on_retry,
            **options,
        )
    from torchstep_airflow.durable import run_durable

    return run_durable(open_try, context, task.log, defer)


def queue_timeout_note(queue: str | None, execution_timeout: Any) -> str | None:
    """What a task that waits in a Kueue queue is told about its ``execution_timeout``.

    Airflow's ``execution_timeout`` counts wall time from the start of the try, so the wait
    for admission counts against it; the step's own timeout (the Jobs' or the Pod's
    ``activeDeadlineSeconds``) counts from admission. With a queue, torchstep derives no
    ``execution_timeout`` (:func:`torchstep_airflow.settings.task_settings`); one the DAG
    author set is kept, and said once per try.

    Args:
        queue: the run option ``queue`` (``None``: no queue, nothing to say).
        execution_timeout: the task's ``execution_timeout`` (``None``: none).

    Returns:
        The warning line, or ``None``.
    """
    if not queue or execution_timeout is None:
        return None
    seconds = execution_timeout.total_seconds() if hasattr(execution_timeout, "total_seconds") else execution_timeout
    return (
        f"torchstep: execution_timeout ({seconds:g} s) counts wall time, the wait in Kueue's queue {queue} "
        "included: a step still queued when it runs out is stopped (its objects deleted) and Airflow retries "
        "or fails the task; the step's own timeout counts from admission (activeDeadlineSeconds). "
        "Fix: leave execution_timeout unset (torchstep then sets none for a queued step) or allow for the queue"
    )


def job_client(kwargs: Mapping[str, Any]) -> OfficialClient:
    """The Kubernetes client of the Job path: the ``KubernetesHook``'s, from the connection
    arguments of ``kubernetes_kwargs`` (the trigger builds the same one in the triggerer)."""
    conn = {k: v for k, v in kwargs.items() if k in ("in_cluster", "config_file", "cluster_context")}
    hook = KubernetesHook(conn_id=kwargs.get("kubernetes_conn_id", KubernetesHook.default_conn_name), **conn)
    return OfficialClient(core=hook.core_v1_client, batch=hook.batch_v1_client, api_client=hook.api_client)


#: Seconds Airflow's own deferral timeout waits after the trigger's deadline (the trigger
#: fires first, so a worker deletes the Jobs; Airflow's timeout is the backstop).
DEFER_TIMEOUT_MARGIN_S = 60.0


def defer_jobs(task: Any, step: Any, context: Any, poll_interval: float) -> None:
    """Create (or attach to) the Jobs of ``step``'s try, then defer ``task`` to a
    :class:`~torchstep_airflow.triggers.JobGangTrigger` until they end (or the task's
    ``execution_timeout`` runs out). An error while creating deletes what was created.

    Raises:
        TaskDeferred: always, once the Jobs exist.
    """
    from datetime import timedelta

    from airflow.sdk.exceptions import TaskDeferred

    from torchstep_airflow.triggers import CONN_KEYS, JobGangTrigger

    gang = step.job_gang()
    try:
        gang.create()
        verb = "attached to" if gang.attached else "created"
        deadline, timeout = None, None
        remaining = _remaining_s(task, context)
        if remaining is not None:
            deadline = time.time() + remaining
            timeout = timedelta(seconds=remaining + DEFER_TIMEOUT_MARGIN_S)
        task.log.info("torchstep: %s the Jobs of %s; waiting for them in the triggerer (deferred)", verb, step.run_id)
        conn = {k: v for k, v in task.kubernetes_kwargs.items() if k in CONN_KEYS}
        trigger = JobGangTrigger(
            run_id=str(step.run_id), handle=handle_of(gang), conn=conn, poll_interval=poll_interval, deadline=deadline
        )
        task.defer(trigger=trigger, method_name="execute_complete", timeout=timeout)
    except TaskDeferred:
        raise
    except BaseException:  # an error, a timeout or a kill before the triggerer took over
        gang.delete()  # nothing may keep running unwatched
        raise


def _remaining_s(task: Any, context: Any) -> float | None:
    """Seconds left of the task's ``execution_timeout`` in this try (``None``: no limit)."""
    if task.execution_timeout is None:
        return None
    limit = task.execution_timeout.total_seconds()
    start = getattr(context.get("ti"), "start_date", None)
    if start is None:
        return limit
    from datetime import datetime, timezone

    now = datetime.now(timezone.utc) if start.tzinfo is not None else datetime.now()
    return max(0.0, limit - (now - start).total_seconds())


def resume_jobs(task: Any, open_try: Any, event: Mapping[str, Any], context: Any) -> StepResult:
    """``execute_complete`` of a deferred Job run: what the trigger saw decides how the
    worker takes the run back (:mod:`torchstep_airflow.triggers`).

    Returns:
        The step result (the run reattached, its logs printed, collected, cleaned up).

    Raises:
        RunError: the Jobs were deleted or replaced while the task waited (retryable).
        AirflowTaskTimeout: the task's ``execution_timeout`` ran out (the run is deleted).
    """
    from torchstep_airflow.durable import resume_durable

    status, run_id = str(event.get("status")), str(event["run_id"])
    if status == "gone":
        RemoteRun(event["handle"], job_client(task.kubernetes_kwargs)).delete()  # what is left of it
        raise RunError(f"run {run_id}", f"{event.get('message')}; fix: let Airflow retry the task (it starts afresh)")
    task.log.info("torchstep: back from the triggerer (%s): %s", status, event.get("message"))

    def reopen(run_id: str, cursor_store: Any = None) -> Any:
        step = open_try(run_id, cursor_store=cursor_store)
        if status == "timeout":
            step.cancel()  # it attaches, prints the last lines, collects CANCELLED and deletes everything
        preemptions = step.job_gang().preemptions  # what the trigger counted still counts
        spared = event.get("workload") if status == "bare_pod" else None  # the watcher replaces it
        preemptions.pods.update({u: n for u, n in (event.get("preempted_pods") or {}).items() if n != spared})
        preemptions.evictions = int(event.get("evictions") or 0)
        return step

    result = resume_durable(reopen, run_id, context)
    if status == "timeout":
        from airflow.sdk.exceptions import AirflowTaskTimeout

        if task.do_xcom_push:
            context["ti"].xcom_push(key="return_value", value=result.to_dict())
        raise AirflowTaskTimeout(f"torchstep: {event.get('message')}; the Jobs of {run_id} were deleted")
    return result


class PodStep:
    """One try of a 1-role, 1-replica app as a :class:`~torchstep.adapter.StepBackend`: the
    KubernetesPodOperator (:class:`StepPodOperator`) runs the rendered pod, so its own
    features hold (``deferrable``, ``reattach_on_restart``, ``on_finish_action``, the XCom
    sidecar), and ``AppDefOperator`` holds it as it holds a core step (``use_step``, ``cancel``).

    Args:
        task: the ``AppDefOperator``.
        plan: the step's plan (target ``kubernetes``).
        rendered: its rendered objects (one bare Pod).
        context: the task's Airflow context.
        event: the trigger's event when the operator comes back from its deferral.
    """

    def __init__(
        self, task: Any, plan: StepPlan, rendered: RenderedApp, context: Any, event: dict[str, Any] | None = None
    ) -> None:
        self.plan = plan
        self.result: StepResult | None = None
        self.try_number = 1  # Airflow retries the task: each try is one PodStep
        self.rendered = rendered
        kwargs = {**task.kubernetes_kwargs, "deferrable": task.deferrable}  # KPO's own deferral
        self.operator = pod_operator(task.task_id, rendered, kwargs, durable=task.durable)
        self.operator.carry = self._carried
        carried = None
        if event is not None:  # what the try's earlier executions kept through the deferral
            event = dict(event)
            carried = event.pop(DEFERRAL_KWARG, None)
        self._context, self._event, self._log = context, event, task.log
        #: This try's preemptions against the run option ``preemption_retries`` (carried
        #: through deferrals: :data:`DEFERRAL_KWARG`).
        self.preemptions = Preemptions(rendered.options.preemption_retries, rendered.options.queue, self.say)
        self._seen_version: str | None = None  # the pod's resourceVersion the operator saw last
        store = _store(context)
        if event is not None and not carried and store is not None:
            kept = store.get(DEFERRAL_STATE_KEY)
            if isinstance(kept, dict) and kept.get("pod") == rendered.roles[0].name:  # this try's pod
                carried = kept
        if carried:
            self.operator.pod_uid = carried.get("uid")
            self._seen_version = carried.get("resource_version")
            self.preemptions.pods.update(carried.get("preempted") or {})

    def run(self) -> StepResult:
        """Run (or resume, after a deferral) the pod operator; the agent's step result.

        A pod that Kubernetes took away (the ``DisruptionTarget`` condition: a drain, an
        eviction, a preemption) is not the step's failure: it is deleted and created again
        under the same name, up to the run option ``preemption_retries`` (the watcher's rule
        for a bare Pod, :class:`~torchstep.adapter.kubernetes.Preemptions`), so Airflow's
        ``retries`` are never spent on it; one more ends the step ``PREEMPTED``, not retryable.

        Returns:
            The step result (its ``warnings`` say any preemption).

        Raises:
            AirflowException: the pod operator's failure when the pod was not disrupted.
            RunError: the pod finished without a result, or a preempted pod would not go.
        """
        op, context, event = self.operator, self._context, self._event
        if event is not None:
            call = lambda: _nested(op, op.trigger_reentry, context, event)  # noqa: E731
        else:
            call = lambda: _nested(op, op.execute, context)  # noqa: E731
        while True:
            try:
                result: StepResult | None = _from_pod(op, self.rendered, call, self._log)
                error: Exception | None = None
            except Exception as e:  # the operator's failure: unless the pod was disrupted, it stands
                result, error = None, e
            if not self._preempted(result):
                if error is not None:
                    raise error
                assert result is not None
                self.result = self._noted(result)
                return self.result
            if self.preemptions.exhausted:
                self.result = self._noted(
                    StepResult(
                        app_id=self.rendered.app_id,
                        state=StepState.PREEMPTED,
                        exit_code=result.exit_code if result is not None else None,
                        retryable=False,
                        message=self.preemptions.exhausted_message(),
                    )
                )
                return self.result
            self._replace()
            call = lambda: _nested(op, op.execute, context)  # noqa: E731

    def _preempted(self, result: StepResult | None) -> bool:
        """Whether this execution's pod ended because Kubernetes disrupted it (read from the
        pod the operator saw last and from the API, by uid); counts it once.

        A succeeded step, a non-retryable failure (exit 82 wins over a disruption, as in the
        rendered Jobs' ``podFailurePolicy``) or a task being killed is never a preemption."""
        op = self.operator
        if op._killed or (result is not None and (result.succeeded or result.exit_code == NON_RETRYABLE_EXIT_CODE)):
            return False
        name, uid = self.rendered.roles[0].name, op.pod_uid
        seen = [op.final_pod, op.remote_pod]
        gone = False
        try:
            seen.append(op.client.read_namespaced_pod(name, self.rendered.namespace))
        except Exception as e:  # gone already (or unreadable): what the operator saw last decides
            gone = getattr(e, "status", None) == 404
        ours = [p for p in seen if p is not None and uid is not None and uid_of(p) == uid and disruption(p)]
        if not ours and gone and uid is not None:  # evicted and deleted before anyone read it
            last = self._last_state(uid)
            if last is not None and disruption(last):
                ours = [last]
        before = self.preemptions.count
        self.preemptions.observe_pods(ours[:1], {name: "Pod"})
        return self.preemptions.count > before

    def _last_state(self, uid: str) -> Any:
        """How pod ``uid``, already gone, ended: its ``DELETED`` event (which carries its
        last conditions, ``DisruptionTarget`` included) in a watch from the last
        resourceVersion the operator saw; ``None`` when that cannot be told (no version
        seen, or the API no longer keeps it)."""
        version = self._seen()
        if version is None:
            return None
        op, name = self.operator, self.rendered.roles[0].name
        client = OfficialClient(core=op.client, batch=None)
        last = None
        watch = client.watch(
            "Pod",
            self.rendered.namespace,
            label_selector=self.rendered.label_selector,
            resource_version=version,
            timeout_seconds=GONE_WATCH_S,
        )
        try:
            for event in watch:
                obj = event.get("object")
                if uid_of(obj) == uid:
                    last = obj
                    if event.get("type") == "DELETED":
                        break
        except Exception as e:  # e.g. 410 Gone: the history is compacted; the failure stands
            self._log.warning("torchstep: could not tell how pod %s ended (%s); counted as its failure", name, e)
            return None
        finally:
            watch.close()
        return last

    def _seen(self) -> str | None:
        """The latest resourceVersion of this try's pod the operator (or the try's
        execution before a deferral) has seen."""
        op, uid = self.operator, self.operator.pod_uid
        versions = [self._seen_version, op.pod_version]
        for pod in (op.pod, op.remote_pod, op.final_pod):
            if pod is not None and uid is not None and uid_of(pod) == uid:
                versions.append(getattr(pod.metadata, "resource_version", None))
        known = [v for v in versions if v]
        if not known:
            return None
        # resourceVersions are opaque strings; an API server's are integers in practice
        return max(known, key=lambda v: (v.isdigit(), int(v) if v.isdigit() else 0))

    def _carried(self) -> dict[str, Any]:
        """What this try keeps through a deferral (:data:`DEFERRAL_KWARG`, and the task state
        store's :data:`DEFERRAL_STATE_KEY` where there is one)."""
        self._seen_version = self._seen()
        state = {
            "pod": self.rendered.roles[0].name,
            "uid": self.operator.pod_uid,
            "resource_version": self._seen_version,
            "preempted": dict(self.preemptions.pods),
        }
        store = _store(self._context)
        if store is not None:
            store.set(DEFERRAL_STATE_KEY, state)
        return state

    def _replace(self) -> None:
        """Delete the preempted pod, wait until it is gone (its grace period, plus 120 s),
        and make the operator create it again on its next ``execute``."""
        op, name, ns = self.operator, self.rendered.roles[0].name, self.rendered.namespace
        try:
            op.client.delete_namespaced_pod(name, ns)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
        uid = op.pod_uid

        def ours() -> Any:  # someone else's pod under the name: find_pod ignores it, the creation says so
            pod = op.client.read_namespaced_pod(name, ns)
            return pod if uid_of(pod) == uid else None

        def pause(seconds: float) -> bool:  # the task being killed stops the wait
            time.sleep(seconds)
            return bool(op._killed)

        wait_until_gone(
            ours,
            f"Pod {ns}/{name}",
            float(self.rendered.roles[0].pod["spec"].get("terminationGracePeriodSeconds", 30)),
            pause,
        )
        # a fresh execution of the same pod request: it creates (and records) a new pod
        op.pod = op.remote_pod = op.final_pod = op.step_result = op.pod_uid = op.pod_version = None
        self._seen_version = None
        self._log.info("torchstep: pod %s created again after its preemption", name)

    def _noted(self, result: StepResult) -> StepResult:
        """``result`` with the preemptions said in its ``warnings`` (as the Job path's)."""
        note = self.preemptions.note()
        if note is not None and note not in result.warnings:
            result.warnings.append(note)
        return result

    def cancel(self) -> None:
        """Stop the pod (KubernetesPodOperator's ``on_kill``)."""
        self.operator.cancel()

    def say(self, text: str) -> None:
        """A note of torchstep's in the task log.

        Args:
            text: the note.
        """
        self._log.info("%s", text)

    def record(self, result: StepResult) -> None:
        """Keep ``result`` (the pod's result lives in its XCom; nothing else to write).

        Args:
            result: the try's final result.
        """
        self.result = result


def _from_pod(op: StepPodOperator, rendered: RenderedApp, call: Any, log: Any) -> StepResult:
    """The step result of the pod operator's run (``call``)."""
    try:
        call()
    except Exception as e:
        if op.step_result is not None:  # KPO's "pod failed" (or a cleanup error): the result says more
            log.warning("torchstep: the pod operator raised %s; reporting the agent's result", e)
        else:
            code = termination(op.final_pod)[0]  # the agent container's
            if code == NON_RETRYABLE_EXIT_CODE:
                return StepResult(
                    app_id=rendered.app_id,
                    state=FAILED,
                    exit_code=code,
                    retryable=False,
                    message="the agent exited non-retryable (82); no result file",
                )
            raise
    if op.step_result is None:
        pod = f"Pod {rendered.namespace}/{rendered.roles[0].name}"
        raise RunError(pod, "it finished without a step result; fix: check the pod log")
    try:
        return StepResult.from_dict(op.step_result)
    except ValueError as e:  # the pod wrote it: refused and said, never a crash; its exit code stands in
        code = termination(op.final_pod)[0]
        return StepResult(
            app_id=rendered.app_id,
            state=SUCCEEDED if code == 0 else FAILED,
            exit_code=code,
            warnings=[f"the pod's step result was refused: {e}"],
        )


def _on_finish(kwargs: Mapping[str, Any]) -> str:
    action = kwargs.get("on_finish_action", "delete_pod")
    if action not in ON_FINISH:
        raise SpecError(
            "kubernetes_kwargs['on_finish_action']", TARGET, f"unknown {action!r}", fix=f"one of {tuple(ON_FINISH)}"
        )
    return ON_FINISH[action]
