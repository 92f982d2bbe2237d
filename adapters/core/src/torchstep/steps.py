"""What every orchestrator adapter does with a plan at run time, written once.

- :class:`LocalStep`: one try of an AppDef on the local target, in the orchestrator's
  worker process: ``run_local`` in a helper thread, each rank's log line to a callback as
  it happens, :meth:`~LocalStep.cancel` from any thread, and whatever interrupts the
  caller's wait (a timeout alarm, a termination signal, an injected cancellation) stops
  every process of the step before it propagates.
- :class:`KubernetesStep`: the same over :class:`torchstep.kubernetes.JobSet`.
- :func:`step_run_id`: the run id of one try, from the orchestrator's identifiers.
- :func:`check_user_retries`: the user's orchestrator-level retries and timeout checked
  against the plan's retry budget, with the same error text on every orchestrator.
- :func:`failure_summary`: one line naming a failed step's state, exit code and root cause.

Adapters map plan fields to their orchestrator and call these; they never re-implement them.

Example::

    >>> step_run_id("train", "fit", "manual__2026-11-21T10:00:00+00:00", "try2")
    'train.fit.manual-2026-11-21t10-00-00-00-00.try2-f5e55d'
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchstep.errors import SpecError
from torchstep.local.status import PlainDisplay, ReplicaEvent
from torchstep.plan.model import RetryOwner, StepPlan
from torchstep.result import root_cause_line

if TYPE_CHECKING:
    from torchstep.kubernetes.client import KubernetesClient
    from torchstep.result import StepResult

__all__ = ["KubernetesStep", "LocalStep", "check_user_retries", "failure_summary", "step_run_id"]

#: Seconds to wait, after a cancel, beyond the run's own grace period (the launcher sends
#: SIGTERM, waits ``grace_period``, then SIGKILLs and reaps everything).
CANCEL_MARGIN_S = 30.0
#: The caller's thread waits in slices this long: an exception injected into it (Prefect's
#: timeouts and cancellations, Airflow's alarm) lands within one slice.
POLL_S = 0.2
#: The longest run id (DNS-1123 subdomains are at most 253 characters).
RUN_ID_MAX = 200
#: How many failed-and-kept Jobs of one logical attempt ``KubernetesStep.for_attempt`` skips.
MAX_KEPT_ATTEMPTS = 50

LineCallback = Callable[[str], None]
log = logging.getLogger("torchstep.steps")
_INVALID = re.compile(r"[^a-z0-9]+")


# -- run ids ---------------------------------------------------------------------------------------
def step_run_id(*parts: object) -> str:
    """The run id of one try of one step: ``parts`` are the orchestrator's identifiers of
    the logical attempt, outermost first (Airflow dag, task, map index, run, try; KFP run,
    task, retry; Prefect flow run, task run). Deterministic (the same parts give the same
    id), unique per try (the try is a part), and DNS-safe: lowercase ``[a-z0-9-]`` words
    joined by ``.``; when that rewriting changed anything, a short hash of the exact parts
    is appended so two different identities never share an id.

    >>> step_run_id("flow-run-1", "task-run-7")
    'flow-run-1.task-run-7'
    >>> step_run_id("Train", "fit") != step_run_id("train", "fit")
    True
    """
    raw = [str(p) for p in parts if p is not None and str(p) != ""]
    if not raw:
        raise ValueError("step_run_id needs at least one non-empty part")
    words = [_INVALID.sub("-", p.lower()).strip("-") or "x" for p in raw]
    text = ".".join(words)
    if words != raw or len(text) > RUN_ID_MAX:
        digest = hashlib.sha256("\x00".join(raw).encode("utf-8", "surrogatepass")).hexdigest()[:6]
        text = f"{text[: RUN_ID_MAX - 7].rstrip('.-')}-{digest}"
    return text


# -- the user's retries against the plan -------------------------------------------------------------
def check_user_retries(
    plan: StepPlan,
    *,
    retries: int | None = None,
    timeout: float | None = None,
    retry_delay: float | None = None,
    retry_backoff: float | None = None,
    max_retry_delay: float | None = None,
    orchestrator: str = "the orchestrator",
) -> None:
    """Raise :class:`~torchstep.SpecError` when the settings the user gave the
    orchestrator's task (``None`` = not set) would add a second retry layer or contradict
    the AppDef; the message is the same on every orchestrator.

    - APPLICATION budget of N: ``retries`` must be unset or N, and the retry timing unset or
      equal to the AppDef's ``retry_delay`` / ``retry_backoff`` / ``max_retry_delay``.
    - REPLICA / HOT_SPARE / ROLE budget: the agent (or the role's launcher) retries, so
      ``retries`` must be unset or 0.
    - A step timeout (``torchstep.timeout``): the orchestrator's own ``timeout`` must not be
      shorter, or it would kill the step before torchstep stops it cleanly and reports it.

    >>> import torchstep
    >>> from torchx import specs
    >>> role = specs.Role("w", image="", entrypoint="true", max_retries=2)
    >>> plan = torchstep.build_plan(specs.AppDef("app", roles=[role]), "local")
    >>> check_user_retries(plan, retries=2)
    >>> check_user_retries(plan, retries=5, orchestrator="Prefect")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: roles[0].max_retries (target 'local'): the AppDef gives Prefect 2 retries of the step (APPLICATION policy) but the task sets retries=5; fix: set the count in one place: drop the task's retries or change max_retries
    """
    target = plan.target
    if retries is not None and (not isinstance(retries, int) or isinstance(retries, bool) or retries < 0):
        raise SpecError("retries", target, f"the task's retries must be a whole number >= 0, got {retries!r}",
                        fix="e.g. retries=2, or leave it out: the AppDef's max_retries decides")  # fmt: skip
    step = plan.step_retry
    if step.count:
        i = step.role_index if step.role_index is not None else 0
        if retries is not None and retries != step.count:
            raise SpecError(
                f"roles[{i}].max_retries",
                target,
                f"the AppDef gives {orchestrator} {step.count} retries of the step (APPLICATION policy) but the "
                f"task sets retries={retries}",
                fix="set the count in one place: drop the task's retries or change max_retries",
            )
        for key, planned, mine in (
            ("retry_delay", step.delay_s, retry_delay),
            ("retry_backoff", step.backoff, retry_backoff),
            ("max_retry_delay", step.max_delay_s, max_retry_delay),
        ):
            if planned is not None and mine is not None and float(mine) != planned:
                raise SpecError(
                    f"roles[{i}].metadata['torchstep'][{key!r}]",
                    target,
                    f"the AppDef sets {key}={planned:g} but the task sets {key}={float(mine):g}",
                    fix="set it in one place",
                )
    elif plan.retry_owner in (RetryOwner.AGENT, RetryOwner.ROLE) and retries:
        i, role = next((i, r) for i, r in enumerate(plan.roles) if r.retry.owner is plan.retry_owner)
        raise SpecError(
            f"roles[{i}].retry_policy",
            target,
            f"role {role.name!r} restarts itself ({role.retry.policy}, max_retries={role.retry.count}); "
            f"{orchestrator} retries={retries} on top would multiply the retry layers",
            fix="set retries=0 on the task, or use RetryPolicy.APPLICATION to let the orchestrator own the budget",
        )
    if timeout is not None:
        if (
            not isinstance(timeout, int | float)
            or isinstance(timeout, bool)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise SpecError("timeout", target, f"the task's timeout {timeout!r} is not a positive number of seconds",
                            fix="e.g. 3600")  # fmt: skip
        if plan.timeout_s is not None and timeout < plan.timeout_s:
            raise SpecError(
                "metadata['torchstep.timeout']",
                target,
                f"{orchestrator}'s timeout of {timeout:g} s would kill the step before its own timeout of "
                f"{plan.timeout_s:g} s stops it cleanly",
                fix="set one timeout: drop the task's, or lower torchstep.timeout",
            )


def failure_summary(result: StepResult) -> str:
    """One line: state, exit code and root cause of a failed step (what adapters log and
    raise with). The root cause is named by :func:`torchstep.result.root_cause_line`: the
    rank's last meaningful line (its exception, else its last log line), as everywhere.

    >>> from torchstep.result import StepResult
    >>> failure_summary(StepResult("train-1", "FAILED", 82, message="worker/1 exited 82 (non-retryable)"))
    'train-1 FAILED (exit code 82); worker/1 exited 82 (non-retryable)'
    """
    text = f"{result.app_id} {result.state}"
    if result.exit_code is not None:
        text += f" (exit code {result.exit_code})"
    rc = result.root_cause
    if rc is not None:
        where = f"{rc.role}/{rc.replica_id if rc.replica_id is not None else '?'} rank {rc.rank}"
        text += f"; root cause: {where}: {root_cause_line(rc)}"
    elif result.message:
        text += f"; {result.message}"
    return text


# -- running a step ------------------------------------------------------------------------------------
class _Runner:
    """Runs ``work`` in a helper thread while the caller's thread waits in slices, so
    whatever interrupts the wait cancels the work and waits for it before propagating."""

    result: StepResult | None = None

    def __init__(self, name: str, grace_s: float) -> None:
        self.name = name
        self.grace_s = grace_s
        self._cancel = threading.Event()

    def _run(self, work: Callable[[], StepResult], on_interrupt: Callable[[], None]) -> StepResult:
        box: dict[str, BaseException] = {}
        done = threading.Event()

        def target() -> None:
            try:
                self.result = work()
            except BaseException as e:  # handed to the waiting thread
                box["error"] = e
            finally:
                done.set()

        # Wait on an Event, not Thread.join: a signal handler raising inside join() makes
        # Python 3.11 mark the still-running thread as stopped (bpo-45274's fix misfires).
        threading.Thread(target=target, name=self.name, daemon=True).start()
        try:
            while not done.wait(POLL_S):
                pass
        except BaseException:  # timeout alarm, termination, cancellation, Ctrl-C: stop everything first
            on_interrupt()
            if not _wait_out(done, self.grace_s + CANCEL_MARGIN_S):
                log.error(
                    "torchstep: the step did not stop within %.0f s of the cancel", self.grace_s + CANCEL_MARGIN_S
                )
            raise
        if "error" in box:
            raise box["error"]
        assert self.result is not None
        return self.result


class LocalStep(_Runner):
    """One try of an AppDef on the local target (see the module docstring).

    ``cfg`` holds the local run options (``torchstep runopts local``); ``run_id`` (from
    :func:`step_run_id`) names the app id and the log directory of this try. ``on_line``
    receives each rank's output line (``[role/rank]`` prefixed) and torchstep's own notes
    as they happen (default: printed); ``on_status`` each replica state change. The step
    never retries the whole app: the orchestrator owns APPLICATION retries.

    Example::

        step = LocalStep(app, run_id=step_run_id(flow_run_id, task_run_id), on_line=logger.info)
        result = step.run()      # blocks; step.cancel() from another thread stops it
    """

    def __init__(
        self,
        app: Any,
        *,
        run_id: str,
        cfg: Mapping[str, Any] | None = None,
        on_line: LineCallback | None = None,
        on_status: Callable[[ReplicaEvent], None] | None = None,
    ) -> None:
        cfg = _with_run_id(cfg, run_id, "local")
        if cfg.get("retries"):
            raise SpecError("cfg['retries']", "local", "the orchestrator owns the step's retries", fix="remove it")
        from torchstep.components.materialize import materialize
        from torchstep.local import resolve
        from torchstep.plan.planner import build_plan

        self.plan = build_plan(materialize(app), "local")
        self.options = resolve(cfg)
        self.run_id = run_id
        self.on_line = on_line
        self.on_status = on_status
        super().__init__(f"torchstep-local-{run_id}", float(self.options.grace_period or 10.0))

    def run(self) -> StepResult:
        """Run to the end and return the step result (re-raises what interrupts the wait,
        after every process of the step has stopped)."""
        from torchstep.local import run_plan

        display = _CallbackDisplay(self.on_line, show_output=self.options.tee) if self.on_line else None
        return self._run(
            lambda: run_plan(self.plan, self.options, on_status=self.on_status, cancel=self._cancel, display=display),
            self.cancel,
        )

    def cancel(self) -> None:
        """Stop every process of the step (from any thread); ``run`` returns CANCELLED."""
        self._cancel.set()


class KubernetesStep(_Runner):
    """One try of an AppDef on Kubernetes, through :class:`torchstep.kubernetes.JobSet`.

    ``cfg`` holds the kubernetes run options (``torchstep runopts kubernetes``);
    ``client`` the Kubernetes client (default, set on first use: the official client from
    the kubeconfig or the in-cluster config); ``on_line`` receives every pod's lines;
    ``cursor_store`` (optional, ``get``/``set``: the orchestrator's state between tries)
    keeps the log position across crashes and the uid of every workload the step creates;
    with it, a rerun attaches only to a workload whose uid it recorded (another one with
    the step's labels is refused by name: :mod:`torchstep.kubernetes.ownership`).

    Running is *attach or create* (:class:`~torchstep.kubernetes.JobSet`): the objects'
    names come from ``run_id``, so running the same ``run_id`` again after the watcher
    died attaches to the running (or finished) Job instead of starting a second one.
    :meth:`for_attempt` picks the run id of a logical attempt for orchestrators that keep
    no state between tries.

    Example::

        step = KubernetesStep(plan, run_id=step_run_id(run, task, retry), cfg={"namespace": "ml"})
        result = step.run()
    """

    def __init__(
        self,
        plan: StepPlan,
        *,
        run_id: str,
        cfg: Mapping[str, Any] | None = None,
        client: KubernetesClient | None = None,
        on_line: LineCallback | None = None,
        poll_interval: float = 2.0,
        on_finish: str = "delete",
        result_file: str | None = None,
        cursor_store: Any = None,
    ) -> None:
        from torchstep.kubernetes import render_app

        cfg = _with_run_id(cfg, run_id, "kubernetes")
        if result_file is not None:
            cfg.setdefault("result_file", result_file)
        self.rendered = render_app(plan, cfg=cfg)
        self.run_id = run_id
        self.client = client
        self.on_line = on_line
        self.poll_interval = poll_interval
        self.on_finish = on_finish
        self.cursor_store = cursor_store
        self.jobs: Any = None
        super().__init__(f"torchstep-kubernetes-{run_id}", 30.0)

    @classmethod
    def for_attempt(cls, plan: StepPlan, *, attempt_id: str, client: KubernetesClient, **kwargs: Any) -> KubernetesStep:
        """The step of one logical attempt, for an orchestrator that keeps no state between
        the tries of a step (KFP, Prefect): run id ``attempt_id``, or ``attempt_id.a2``,
        ``.a3``... past every earlier Job of it that *failed* and was kept (a retry after a
        failure must start afresh; a rerun after the watcher died must attach). ``client``
        is required: finding the attempt reads the cluster.

        Example::

            step = KubernetesStep.for_attempt(plan, attempt_id=step_run_id("kfp", job, task), client=kube)
        """
        from torchstep.result import FAILED

        for n in range(1, MAX_KEPT_ATTEMPTS + 1):
            run_id = attempt_id if n == 1 else f"{attempt_id}.a{n}"
            step = cls(plan, run_id=run_id, client=client, **kwargs)
            if step.job_set().state() != FAILED:
                return step
            log.info("torchstep: %s failed earlier and was kept; trying the next attempt", run_id)
        raise SpecError(
            "attempt_id", "kubernetes", f"{MAX_KEPT_ATTEMPTS} failed Jobs of {attempt_id!r} are still kept",
            fix="delete the failed Jobs (kubectl delete jobs -l torchstep/app-id=...) or use on_finish='delete'",
        )  # fmt: skip

    @property
    def attached(self) -> bool:
        """Whether this run attached to workloads created earlier (after ``run``)."""
        return bool(self.jobs is not None and self.jobs.attached)

    def state(self) -> str | None:
        """The run's state on the cluster (:meth:`torchstep.kubernetes.JobSet.state`):
        ``None`` if nothing of it exists, else RUNNING, SUCCEEDED or FAILED."""
        state: str | None = self.job_set().state()
        return state

    def job_set(self) -> Any:
        """The :class:`~torchstep.kubernetes.JobSet` of this try (created on first use)."""
        if self.jobs is None:
            from torchstep.kubernetes.client import OfficialClient
            from torchstep.kubernetes.jobs import JobSet

            if self.client is None:
                self.client = OfficialClient.from_config()
            self.jobs = JobSet(
                self.rendered, self.client, on_line=self.on_line, poll_interval=self.poll_interval,
                on_finish=self.on_finish, cursor_store=self.cursor_store,
            )  # fmt: skip
            if self._cancel.is_set():  # cancelled before it started: it creates nothing that keeps running
                self.jobs.cancel()
        return self.jobs

    def run(self) -> StepResult:
        jobs = self.job_set()
        return self._run(jobs.run, jobs.cancel)

    def cancel(self) -> None:
        self._cancel.set()
        if self.jobs is not None:
            self.jobs.cancel()


def _with_run_id(cfg: Mapping[str, Any] | None, run_id: str, target: str) -> dict[str, Any]:
    """A copy of ``cfg`` holding the orchestrator's ``run_id``; one of the user's is refused."""
    out = dict(cfg or {})
    if out.get("run_id") not in (None, run_id):
        raise SpecError("cfg['run_id']", target, "the run id is set by the orchestrator (per try)", fix="remove it")
    out["run_id"] = run_id
    return out


class _CallbackDisplay(PlainDisplay):
    """A local run's display that hands every line to a callback (a logger)."""

    def __init__(self, on_line: LineCallback, *, show_output: bool) -> None:
        super().__init__(show_output=show_output)
        self._on_line = on_line

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self._on_line(text)
            except Exception:  # a logger that fails must not stop the run
                pass


def _wait_out(done: threading.Event, seconds: float) -> bool:
    """Wait for ``done`` up to ``seconds`` in slices; a second interrupt during the wait
    (another signal) still waits for the processes to stop, it only shortens nothing."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if done.wait(POLL_S):
                return True
        except BaseException:
            continue
    return done.is_set()
