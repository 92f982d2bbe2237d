"""The Kubernetes step kind: one try of a plan for the kubernetes target, through
:class:`torchstep.kubernetes.JobGang` (:class:`KubernetesStep`).

A try is named by its run id: the same run id opened again (its watcher died) attaches to
its running or finished Jobs. An orchestrator that keeps no state between tries (KFP,
Prefect) names the *logical attempt* instead (``logical_attempt``): its try is then found on
the cluster, at the first use, by one list of the namespace's pods with the plan's labels —
the latest try that exists, or a fresh one past a failed try that was kept.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchstep.errors import RunError, SpecError
from torchstep.plan.model import StepPlan
from torchstep.result import FAILED
from torchstep.steps.backend import check_plan, with_run_id
from torchstep.steps.ids import retry_run_id
from torchstep.steps.runner import CancellableRunner, LineCallback

if TYPE_CHECKING:
    from torchstep.kubernetes.client import KubernetesClient
    from torchstep.kubernetes.jobs import CursorStore, JobGang
    from torchstep.kubernetes.render import RenderedApp
    from torchstep.result import StepResult

__all__ = ["MAX_KEPT_TRIES", "KubernetesStep", "termination_grace_s"]

#: How many failed-and-kept tries of one logical attempt are skipped before giving up.
MAX_KEPT_TRIES = 50
#: Kubernetes' own ``terminationGracePeriodSeconds`` when a pod spec sets none.
KUBERNETES_DEFAULT_GRACE_S = 30.0
log = logging.getLogger("torchstep.steps")
_UNREAD = object()


def termination_grace_s(rendered: RenderedApp) -> float:
    """The longest time any pod of a rendered run may take to stop once deleted: its
    ``terminationGracePeriodSeconds`` (the role's grace period plus the pod margin), else
    Kubernetes' default.

    Args:
        rendered: the rendering of one run.

    Returns:
        Seconds.
    """
    graces = [
        float(r.template.get("spec", {}).get("terminationGracePeriodSeconds", KUBERNETES_DEFAULT_GRACE_S))
        for r in rendered.roles
    ]
    return max(graces, default=KUBERNETES_DEFAULT_GRACE_S)


class KubernetesStep(CancellableRunner):
    """One try of a plan for the kubernetes target, through :class:`torchstep.kubernetes.JobGang`.

    Args:
        plan: ``torchstep.build_plan(app, "kubernetes")`` (rendered now: bad ``cfg`` fails
            before anything is created).
        run_id: the try's run id; the objects' names are a hash of it, so running the same
            run id again after the watcher died attaches to the running (or finished) Job
            instead of starting a second one. ``None``: a fresh random id.
        logical_attempt: instead of ``run_id``, the run id of the logical attempt, for an
            orchestrator that keeps no try number: the try is ``logical_attempt``, or
            ``<logical_attempt>.try<n>`` past every earlier try that *failed* and was kept
            (a retry after a failure starts afresh; a rerun after the watcher died
            attaches), found on the cluster at the first use (:attr:`run_id`).
        cfg: the kubernetes cfg table (``torchstep runopts kubernetes``).
        client: the Kubernetes client (default, on first use: the official client from the
            kubeconfig or the in-cluster config).
        on_line: receives every pod's lines and torchstep's notes (default: printed).
        cursor_store: the orchestrator's state between tries (``get``/``set``): the log
            position across crashes and the uid of every workload the step creates; with
            it, a rerun attaches only to a workload whose uid it recorded
            (:mod:`torchstep.kubernetes.ownership`).
        poll_interval: seconds between status reads.
        on_finish: ``delete``, ``delete_succeeded`` or ``keep``.
        result_file: where the agent writes the step result in the container.
        try_number: which try of :func:`~torchstep.steps.run_tries` this is (the result's
            ``attempts``); 1 outside that loop.
        say_attaching: when ``run()`` finds the try's workloads already there, say so in the
            step's log (one state read first; :func:`~torchstep.steps.open_step` asks for it).

    Raises:
        SpecError: a plan for another target, both ``run_id`` and ``logical_attempt``, or a
            bad option.

    After a cancel, the step waits for its pods' own grace period
    (:func:`termination_grace_s`) before it gives up waiting.

    Example::

        step = KubernetesStep(plan, run_id=step_run_id(run, task, retry), cfg={"namespace": "ml"})
        result = step.run()
    """

    def __init__(
        self,
        plan: StepPlan,
        *,
        run_id: str | None = None,
        logical_attempt: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        client: KubernetesClient | None = None,
        on_line: LineCallback | None = None,
        cursor_store: CursorStore | None = None,
        poll_interval: float = 2.0,
        on_finish: str = "delete",
        result_file: str | None = None,
        try_number: int = 1,
        say_attaching: bool = False,
    ) -> None:
        from torchstep.kubernetes import render_app

        self.plan = check_plan(plan, "kubernetes")
        if run_id is not None and logical_attempt is not None:
            raise SpecError(
                "logical_attempt",
                "kubernetes",
                "a step has a run id or a logical attempt, not both",
                fix="give run_id (the orchestrator's try) or logical_attempt (no try number)",
            )
        self._cfg = with_run_id(cfg, run_id, "kubernetes")
        if result_file is not None:
            self._cfg.setdefault("result_file", result_file)
        # rendered now under the logical attempt's own id: bad cfg fails before anything exists
        first = self._cfg if logical_attempt is None else with_run_id(self._cfg, logical_attempt, "kubernetes")
        self.rendered = render_app(plan, cfg=first)
        self.logical_attempt = logical_attempt
        self._run_id = run_id
        self.client = client
        self.poll_interval = poll_interval
        self.on_finish = on_finish
        self.cursor_store = cursor_store
        self.say_attaching = say_attaching
        self.jobs: JobGang | None = None
        self._found: object = _UNREAD if run_id is not None or logical_attempt is not None else None
        name = f"torchstep-kubernetes-{run_id or logical_attempt or self.rendered.app_id}"
        super().__init__(name, termination_grace_s(self.rendered), on_line, try_number)

    @property
    def run_id(self) -> str | None:
        """The try's run id; for a logical attempt, found on the cluster at the first use
        (one list of pods, then the state of the latest try that exists).

        Raises:
            RunError: not retryable, when :data:`MAX_KEPT_TRIES` failed tries of the logical
                attempt are kept.
        """
        if self.logical_attempt is not None and self._run_id is None:
            self._find_try()
        return self._run_id

    @property
    def found(self) -> str | None:
        """The state the try's workloads had when the step first looked (at the first use:
        ``None`` if nothing of it exists, else RUNNING, SUCCEEDED or FAILED); ``None``
        without reading for a fresh random run id."""
        if self._found is _UNREAD:
            run_id = self.run_id  # a logical attempt's try is found first, with its state
            if self._found is _UNREAD:
                self._found = self.state() if run_id is not None else None
        return self._found  # type: ignore[return-value]

    @property
    def attached(self) -> bool:
        """Whether this run attached to workloads created earlier (after ``run``)."""
        return bool(self.jobs is not None and self.jobs.attached)

    def state(self) -> str | None:
        """The run's state on the cluster (:meth:`torchstep.kubernetes.JobGang.state`).

        Returns:
            ``None`` if nothing of it exists, else RUNNING, SUCCEEDED or FAILED.
        """
        return self.job_gang().state()

    def job_gang(self) -> JobGang:
        """The :class:`~torchstep.kubernetes.JobGang` of this try (created on first use,
        after the try's run id is known).

        Returns:
            The try's :class:`~torchstep.kubernetes.JobGang`, the same object on every call.
        """
        if self.jobs is None:
            from torchstep.kubernetes.jobs import JobGang

            self.run_id  # noqa: B018 -- a logical attempt's try is found (and rendered) first
            self.jobs = JobGang(
                self.rendered,
                self._client(),
                on_line=self.on_line,
                poll_interval=self.poll_interval,
                on_finish=self.on_finish,
                cursor_store=self.cursor_store,
            )
            if self._cancel.is_set():  # cancelled before it started: it creates nothing that keeps running
                self.jobs.cancel()
        return self.jobs

    def run(self) -> StepResult:
        """Find the try (a logical attempt's), attach or create, follow, collect, clean up.

        Returns:
            The step result.
        """
        jobs = self.job_gang()
        if self.say_attaching and self.found is not None:
            self.say(f"the Jobs of {self.run_id} exist (an earlier try of this step created them): attaching")
        return self._run(jobs.run)

    def cancel(self) -> None:
        """Stop every pod of the try (from any thread); ``run`` returns CANCELLED."""
        self._cancel.set()
        if self.jobs is not None:
            self.jobs.cancel()

    def record(self, result: StepResult) -> None:
        """Nothing to keep: a Kubernetes try's result lives in its pods and the orchestrator.

        Args:
            result: the try's final result.
        """

    def _client(self) -> KubernetesClient:
        if self.client is None:
            from torchstep.kubernetes.client import OfficialClient

            try:
                self.client = OfficialClient.from_config()
            except Exception as e:
                if type(e).__name__ != "ConfigException":  # kubernetes.config's: no kubeconfig, not in a pod
                    raise
                # one line, not the client's 30-line traceback (kfp.local with several replicas)
                raise RunError(
                    "the kubernetes target",
                    f"no cluster to run on: {str(e).rstrip('.')} (no $KUBECONFIG or ~/.kube/config, not inside a pod); "
                    "fix: run where kubectl works or inside the cluster (under kfp.local a KFP step of several "
                    "replicas is a launcher of Kubernetes Jobs: give it one replica there)",
                    retryable=False,
                ) from None
        return self.client

    def _find_try(self) -> None:
        """Pick the logical attempt's try: the latest one with pods (by their app-id label;
        every earlier try failed, or a later one would not exist), or the next one after it
        when it failed."""
        from torchstep.kubernetes.apiobj import get
        from torchstep.kubernetes.render import LABEL_APP_ID, LABEL_MANAGED_BY, LABEL_NAME, render_app
        from torchstep.plan.names import run_name

        assert self.logical_attempt is not None
        name = self.plan.k8s_name
        tries = {run_name(name, retry_run_id(self.logical_attempt, n)): n for n in range(1, MAX_KEPT_TRIES + 1)}
        selector = f"{LABEL_MANAGED_BY}=torchstep,{LABEL_NAME}={self.plan.k8s_name}"
        pods = get(self._client().list_namespaced_pod(self.rendered.namespace, label_selector=selector), "items")
        seen = [tries.get(str((get(p, "metadata", "labels") or {}).get(LABEL_APP_ID))) for p in pods or []]
        n = max((k for k in seen if k is not None), default=1)
        while n <= MAX_KEPT_TRIES:
            run_id = retry_run_id(self.logical_attempt, n)
            if n > 1:
                self.rendered = render_app(self.plan, cfg=with_run_id(self._cfg, run_id, "kubernetes"))
            self._run_id, self.jobs, self._found = run_id, None, _UNREAD
            if self.found != FAILED:
                return
            log.info("torchstep: %s failed earlier and was kept; trying the next try", run_id)
            n += 1
        raise RunError(
            f"attempt {self.logical_attempt!r}",
            f"{MAX_KEPT_TRIES} failed Jobs of it are still kept; fix: delete the failed Jobs "
            "(kubectl delete jobs -l torchstep/app-id=...) or use on_finish='delete'",
            retryable=False,
        )
