"""The run-time seam: what every orchestrator adapter does with a plan, written once.

An adapter plans once (``torchstep.build_plan``), maps the plan's fields to its
orchestrator, and at run time calls one of these two:

- :func:`open_step`: the step of one try — :class:`LocalStep` or :class:`KubernetesStep`,
  picked from ``plan.target`` — named from the orchestrator's identity of the try
  (:class:`Attempt`), attached to the Jobs of an earlier try when they exist.
- :func:`run_tries`: the one APPLICATION retry loop, for an entry point that owns the
  budget itself (``torchstep run``, the ``torchstep_local`` scheduler, the KFP launcher
  step under ``kfp.local``, Airflow's generic DAG): the plan's delays, the non-retryable
  verdict and cancellation.

And the rules around them: :func:`step_run_id` (a run id from the orchestrator's
identifiers), :func:`check_user_retries` (the task's own retries against the plan),
:func:`failure_summary` (the line adapters log and raise with), :func:`run_local`.

Both step kinds run in a helper thread while the caller's thread waits in slices: whatever
interrupts that wait (a timeout alarm, a termination signal, an injected cancellation)
stops every process of the step before it propagates; ``cancel()`` works from any thread.

Example::

    >>> step_run_id("train", "fit", "manual__2026-11-21T10:00:00+00:00", "try2")
    'train.fit.manual-2026-11-21t10-00-00-00-00.try2-f5e55d'
    >>> Attempt(("train", "fit", "manual__1"), try_number=2).run_id
    'train.fit.manual-1.try2-0834f0'
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from torchstep.errors import RunError, SpecError
from torchstep.local.status import PlainDisplay, ReplicaEvent
from torchstep.plan.model import StepPlan
from torchstep.plan.rules.retry import check_user_retries
from torchstep.result import CANCELLED, FAILED, is_retryable, root_cause_line
from torchstep.untrusted import MAX_TAIL_LINE_BYTES, cut, escape_controls

if TYPE_CHECKING:
    from torchstep.kubernetes.client import KubernetesClient
    from torchstep.result import StepResult

__all__ = [
    "Attempt",
    "KubernetesStep",
    "LocalStep",
    "check_user_retries",
    "failure_summary",
    "open_step",
    "run_local",
    "run_tries",
    "run_with_deadline",
    "step_run_id",
    "stop_on_signals",
]

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
#: The wait before a retry whose delay the AppDef leaves unset (``retry_delay``).
DEFAULT_RETRY_DELAY_S = 1.0

LineCallback = Callable[[str], None]
log = logging.getLogger("torchstep.steps")
_INVALID = re.compile(r"[^a-z0-9]+")


# -- the identity of a try ------------------------------------------------------------------
def step_run_id(*parts: object) -> str:
    """The run id of one try of one step: ``parts`` are the orchestrator's identifiers of
    the logical attempt, outermost first (Airflow dag, task, map index, run, try; KFP run,
    task; Prefect flow run, task call). Deterministic (the same parts give the same id),
    unique per try (the try is a part), and DNS-safe: lowercase ``[a-z0-9-]`` words joined
    by ``.``; when that rewriting changed anything, a short hash of the exact parts is
    appended so two different identities never share an id.

    Args:
        parts: the identifiers; ``None`` and ``""`` are left out.

    Returns:
        The run id (at most :data:`RUN_ID_MAX` characters).

    Raises:
        ValueError: no part is left.

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


@dataclass(frozen=True)
class Attempt:
    """The orchestrator's identity of one logical attempt of a step, and of the try.

    ``parts`` name the logical attempt, outermost first (Airflow: dag, task, map index, DAG
    run; KFP: ``"kfp"``, pipeline job, task; Prefect: ``"prefect"``, flow run, task call).
    ``try_number`` is the orchestrator's try (1, 2, ...) when it keeps one, else ``None``:
    then the tries of a Kubernetes step are told apart on the cluster — a rerun after the
    watcher died attaches to the attempt's running (or finished) Jobs, a retry after a
    failure starts afresh (:meth:`KubernetesStep.for_attempt`).

    >>> Attempt(("kfp", "job-1", "task-7")).run_id
    'kfp.job-1.task-7'
    >>> Attempt(("kfp", "job-1", "task-7")).again(2).run_id
    'kfp.job-1.task-7.attempt-2'

    Args:
        parts: what names the logical attempt, outermost first (each part as ``str``).
        try_number: the orchestrator's try (1, 2, ...); ``None`` when it keeps none.
    """

    parts: tuple[object, ...]
    try_number: int | None = None

    @property
    def logical_id(self) -> str:
        """The run id of the logical attempt (every try of it)."""
        return step_run_id(*self.parts)

    @property
    def run_id(self) -> str:
        """The run id of this try (:func:`step_run_id` of the parts and ``try<n>``)."""
        return step_run_id(*self.parts, *(() if self.try_number is None else (f"try{self.try_number}",)))

    def again(self, n: int) -> Attempt:
        """The ``n``-th try of :func:`run_tries` inside this one.

        Args:
            n: the try's number inside this attempt (>= 2; the first try is the attempt itself).

        Returns:
            The attempt whose run id ends in ``.attempt-<n>``.
        """
        return Attempt((*self.parts, *(() if self.try_number is None else (f"try{self.try_number}",)), f"attempt-{n}"))


AttemptLike = Attempt | tuple[object, ...] | str | None


def _attempt(value: AttemptLike) -> Attempt | str | None:
    """An ``attempt`` argument as given: an :class:`Attempt`, the parts of one (a tuple), an
    exact run id (a string) or ``None`` (no orchestrator identity: a fresh id per try)."""
    if isinstance(value, tuple):
        return Attempt(value)
    if value is None or isinstance(value, Attempt) or (isinstance(value, str) and value.strip()):
        return value
    raise SpecError("attempt", None, f"{value!r} is not an attempt",
                    fix="Attempt(parts, try_number), a tuple of identifiers, a run id string, or None")  # fmt: skip


def _again(value: Any, n: int) -> Any:
    """``value`` (an attempt or an app id) for try ``n`` of :func:`run_tries`."""
    if n == 1 or value is None:
        return value
    return value.again(n) if isinstance(value, Attempt) else f"{value}-attempt-{n}"


def _run_id(attempt: Attempt | str | None) -> str | None:
    return attempt.run_id if isinstance(attempt, Attempt) else attempt


# -- the one line of a failure ----------------------------------------------------------------
def failure_summary(result: StepResult) -> str:
    """One line: state, exit code and root cause of a failed step (what adapters log and
    raise with). The root cause is named by :func:`torchstep.result.root_cause_line`: the
    rank's last meaningful line (its exception, else its last log line), as everywhere.

    Args:
        result: the step's result.

    Returns:
        ``<app id> <state> (exit code N); <message or root cause>``.

    >>> from torchstep.result import StepResult
    >>> failure_summary(StepResult("train-1", "FAILED", 82, message="worker replica 1 exited 82 (non-retryable)"))
    'train-1 FAILED (exit code 82); worker replica 1 exited 82 (non-retryable)'
    """
    text = f"{result.app_id} {result.state}"
    if result.exit_code is not None:
        text += f" (exit code {result.exit_code})"
    rc = result.root_cause
    if rc is not None:
        where = f"rank {rc.rank} ({rc.role} replica {rc.replica_id if rc.replica_id is not None else '?'})"
        text += f"; root cause: {where}: {root_cause_line(rc)}"
    elif result.message:  # it may quote a worker or a pod: one line, shown, never obeyed
        text += f"; {cut(escape_controls(result.message, newlines=True), MAX_TAIL_LINE_BYTES)}"
    return text


# -- running one try ---------------------------------------------------------------------------------
class _Runner:
    """Runs ``work`` in a helper thread while the caller's thread waits in slices, so
    whatever interrupts the wait cancels the work and waits for it before propagating."""

    result: StepResult | None = None
    run_id: str | None = None
    #: Which try of :func:`run_tries` this is (the result's ``attempts``).
    try_number: int = 1

    def __init__(self, name: str, grace_s: float, on_line: LineCallback | None) -> None:
        self.name = name
        self.grace_s = grace_s
        self.on_line = on_line
        self._cancel = threading.Event()

    def say(self, text: str) -> None:
        """A note of torchstep's in the step's log (where its ranks' lines go)."""
        _say(self.on_line, text)

    def cancel(self) -> None:
        """Stop every process of the step (from any thread); ``run`` returns CANCELLED."""
        self._cancel.set()

    def _stop(self, interrupt: BaseException) -> None:
        self.cancel()

    def _run(self, work: Callable[[], StepResult]) -> StepResult:
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
        except BaseException as e:  # timeout alarm, termination, cancellation, Ctrl-C: stop everything first
            self._stop(e)
            if not self._wait_out(done, self.grace_s + CANCEL_MARGIN_S):
                log.error(
                    "torchstep: the step did not stop within %.0f s of the cancel", self.grace_s + CANCEL_MARGIN_S
                )
            raise
        if "error" in box:
            raise box["error"]
        assert self.result is not None
        self.result.attempts = self.try_number
        return self.result

    def _wait_out(self, done: threading.Event, seconds: float) -> bool:
        """Wait for ``done`` up to ``seconds`` in slices; another interrupt during the wait
        (another signal) is handed to ``_stop`` too and the wait goes on."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if done.wait(POLL_S):
                    return True
            except BaseException as e:
                self._stop(e)
        return done.is_set()


def _plan_for(plan: Any, target: str) -> StepPlan:
    if not isinstance(plan, StepPlan) or plan.target != target:
        got = f"a plan for target {plan.target!r}" if isinstance(plan, StepPlan) else type(plan).__name__
        raise SpecError("plan", target, f"a {target} step runs a plan for target {target!r}, got {got}",
                        fix=f"torchstep.build_plan(app, {target!r}) once, and pass the plan")  # fmt: skip
    return plan


class LocalStep(_Runner):
    """One try of a plan for the local target, in the orchestrator's worker process.

    Args:
        plan: ``torchstep.build_plan(app, "local")``.
        run_id: the try's run id (:func:`step_run_id`; the app id is ``<app>-<hash of it>``);
            ``None``: a fresh random app id.
        cfg: the local run options (``torchstep runopts local``); ``run_id`` and
            ``retries`` are the orchestrator's and refused here.
        on_line: receives each rank's output line (``[role/rank]`` prefixed) and torchstep's
            own notes as they happen (default: printed).
        on_status: receives each replica state change (:class:`ReplicaEvent`).
        app_id: the exact app id (and run directory name) instead of one made from ``run_id``.
        display: where the lines go instead of ``on_line`` (``torchstep run``'s live table).

    Raises:
        SpecError: a plan for another target, or a bad option.

    ``run()`` blocks and returns the :class:`~torchstep.StepResult`; ``cancel()`` from any
    thread stops every process (SIGTERM, the grace period, SIGKILL); a second Ctrl-C while
    it stops kills at once. The step never retries the whole app (:func:`run_tries` does).

    Example::

        step = LocalStep(plan, run_id=step_run_id(flow_run_id, task_run_id), on_line=logger.info)
        result = step.run()      # blocks; step.cancel() from another thread stops it
    """

    def __init__(
        self,
        plan: StepPlan,
        *,
        run_id: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        on_line: LineCallback | None = None,
        on_status: Callable[[ReplicaEvent], None] | None = None,
        app_id: str | None = None,
        display: PlainDisplay | None = None,
    ) -> None:
        from torchstep.local import resolve

        self.plan = _plan_for(plan, "local")
        cfg = _with_run_id(cfg, run_id, "local")
        if cfg.get("retries"):
            raise SpecError("cfg['retries']", "local", "the orchestrator owns the step's retries", fix="remove it")
        self.options = resolve(cfg)
        self.run_id = run_id
        self.app_id = app_id
        self.on_status = on_status
        self._kill = threading.Event()
        if display is None and on_line is not None:
            display = _CallbackDisplay(on_line, show_output=self.options.tee)
        self.display = display or PlainDisplay(show_output=self.options.tee)
        super().__init__(
            f"torchstep-local-{run_id or app_id or plan.app_name}", float(self.options.grace_period), on_line
        )

    def say(self, text: str) -> None:
        """A note of torchstep's in the step's log (where its ranks' lines go).

        Args:
            text: the note, one line.
        """
        self.display.note(text)

    def run(self) -> StepResult:
        """Run to the end and return the step result (re-raises what interrupts the wait,
        after every process of the step has stopped)."""
        from torchstep.local import run_plan

        kwargs: dict[str, Any] = {"on_status": self.on_status, "display": self.display, "app_id": self.app_id}
        return self._run(lambda: run_plan(self.plan, self.options, cancel=self._cancel, kill=self._kill,
                                          attempt=self.try_number, **kwargs))  # fmt: skip

    def kill(self) -> None:
        """Stop every process of the step at once (SIGKILL, no grace period)."""
        self._kill.set()
        self.cancel()

    def _stop(self, interrupt: BaseException) -> None:
        if isinstance(interrupt, KeyboardInterrupt) and self._cancel.is_set():
            self.kill()  # a second Ctrl-C: no more grace
        self.cancel()


class KubernetesStep(_Runner):
    """One try of a plan for the kubernetes target, through :class:`torchstep.kubernetes.JobGang`.

    Args:
        plan: ``torchstep.build_plan(app, "kubernetes")`` (rendered now: bad ``cfg`` fails
            before anything is created).
        run_id: the try's run id; the objects' names are a hash of it, so running the same
            run id again after the watcher died attaches to the running (or finished) Job
            instead of starting a second one. ``None``: a fresh random id.
        cfg: the kubernetes run options (``torchstep runopts kubernetes``).
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

    Raises:
        SpecError: a plan for another target, or a bad option.

    Example::

        step = KubernetesStep(plan, run_id=step_run_id(run, task, retry), cfg={"namespace": "ml"})
        result = step.run()
    """

    def __init__(
        self,
        plan: StepPlan,
        *,
        run_id: str | None = None,
        cfg: Mapping[str, Any] | None = None,
        client: KubernetesClient | None = None,
        on_line: LineCallback | None = None,
        cursor_store: Any = None,
        poll_interval: float = 2.0,
        on_finish: str = "delete",
        result_file: str | None = None,
    ) -> None:
        from torchstep.kubernetes import render_app

        cfg = _with_run_id(cfg, run_id, "kubernetes")
        if result_file is not None:
            cfg.setdefault("result_file", result_file)
        self.plan = _plan_for(plan, "kubernetes")
        self.rendered = render_app(plan, cfg=cfg)
        self.run_id = run_id
        self.client = client
        self.poll_interval = poll_interval
        self.on_finish = on_finish
        self.cursor_store = cursor_store
        self.jobs: Any = None
        #: The state the step's workloads had when :func:`open_step` picked it.
        self.found: str | None = None
        super().__init__(f"torchstep-kubernetes-{run_id}", 30.0, on_line)

    @classmethod
    def for_attempt(cls, plan: StepPlan, *, attempt_id: str, client: KubernetesClient, **kwargs: Any) -> KubernetesStep:
        """The step of one logical attempt, for an orchestrator that keeps no state between
        the tries of a step (KFP, Prefect): run id ``attempt_id``, or ``attempt_id.a2``,
        ``.a3``... past every earlier Job of it that *failed* and was kept (a retry after a
        failure must start afresh; a rerun after the watcher died must attach). ``client``
        is required: finding the attempt reads the cluster. :func:`open_step` calls it for
        an :class:`Attempt` without a try number.

        Args:
            plan: a plan for the ``kubernetes`` target.
            attempt_id: the orchestrator's identity of the logical attempt (:func:`step_run_id`).
            client: the Kubernetes client (the cluster is read to find the try).
            **kwargs: the other keyword arguments of :class:`KubernetesStep`.

        Returns:
            The step, its run id chosen.

        Raises:
            RunError: not retryable, when ``MAX_KEPT_ATTEMPTS`` failed Jobs of the attempt are kept.

        Example::

            step = KubernetesStep.for_attempt(plan, attempt_id=step_run_id("kfp", job, task), client=kube)
        """
        for n in range(1, MAX_KEPT_ATTEMPTS + 1):
            run_id = attempt_id if n == 1 else f"{attempt_id}.a{n}"
            step = cls(plan, run_id=run_id, client=client, **kwargs)
            step.found = step.state()
            if step.found != FAILED:
                return step
            log.info("torchstep: %s failed earlier and was kept; trying the next attempt", run_id)
        raise RunError(
            f"attempt {attempt_id!r}", f"{MAX_KEPT_ATTEMPTS} failed Jobs of it are still kept; fix: delete the failed "
            "Jobs (kubectl delete jobs -l torchstep/app-id=...) or use on_finish='delete'", retryable=False,
        )  # fmt: skip

    @property
    def attached(self) -> bool:
        """Whether this run attached to workloads created earlier (after ``run``)."""
        return bool(self.jobs is not None and self.jobs.attached)

    def state(self) -> str | None:
        """The run's state on the cluster (:meth:`torchstep.kubernetes.JobGang.state`):
        ``None`` if nothing of it exists, else RUNNING, SUCCEEDED or FAILED."""
        state: str | None = self.job_gang().state()
        return state

    def job_gang(self) -> Any:
        """The :class:`~torchstep.kubernetes.JobGang` of this try (created on first use).

        Returns:
            The try's :class:`~torchstep.kubernetes.JobGang`, the same object on every call.
        """
        if self.jobs is None:
            from torchstep.kubernetes.client import OfficialClient
            from torchstep.kubernetes.jobs import JobGang

            if self.client is None:
                self.client = OfficialClient.from_config()
            self.jobs = JobGang(
                self.rendered, self.client, on_line=self.on_line, poll_interval=self.poll_interval,
                on_finish=self.on_finish, cursor_store=self.cursor_store,
            )  # fmt: skip
            if self._cancel.is_set():  # cancelled before it started: it creates nothing that keeps running
                self.jobs.cancel()
        return self.jobs

    def job_set(self) -> Any:
        """Deprecated name of :meth:`job_gang` (until 0.2), for one release.

        Returns:
            :meth:`job_gang`, after a :class:`DeprecationWarning`.
        """
        warnings.warn("KubernetesStep.job_set() was renamed job_gang()", DeprecationWarning, stacklevel=2)
        return self.job_gang()

    def run(self) -> StepResult:
        """Attach or create, follow, collect, clean up; the step result."""
        jobs = self.job_gang()
        return self._run(jobs.run)

    def cancel(self) -> None:
        self._cancel.set()
        if self.jobs is not None:
            self.jobs.cancel()


def _with_run_id(cfg: Mapping[str, Any] | None, run_id: str | None, target: str) -> dict[str, Any]:
    """A copy of ``cfg`` holding the orchestrator's ``run_id``; one of the user's is refused."""
    out = dict(cfg or {})
    if out.get("run_id") not in (None, run_id):
        raise SpecError("cfg['run_id']", target, "the run id is set by the orchestrator (per try)", fix="remove it")
    if run_id is not None:
        out["run_id"] = run_id
    return out


def _say(on_line: LineCallback | None, text: str) -> None:
    try:
        (on_line or print)(f"torchstep: {text}")
    except Exception:  # a logger that fails must not stop the run
        pass


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


# -- the seam ----------------------------------------------------------------------------------------
def open_step(
    plan: StepPlan,
    *,
    attempt: AttemptLike,
    cfg: Mapping[str, Any] | None = None,
    client: KubernetesClient | None = None,
    on_line: LineCallback | None = None,
    cursor_store: Any = None,
    **options: Any,
) -> LocalStep | KubernetesStep:
    """The step of one try of ``plan``: a :class:`LocalStep` or a :class:`KubernetesStep`,
    picked from ``plan.target``. Nothing runs until its ``run()``.

    Attach or create: the step is named from ``attempt``, so the same try opened again (its
    watcher died) finds its Jobs. When they exist, that is said once, in the step's log.

    Args:
        plan: the plan, built once (``torchstep.build_plan(app, "local" | "kubernetes")``).
        attempt: the orchestrator's identity of the try: an :class:`Attempt` (or the tuple of
            its parts: no try number), an exact run id, or ``None`` (a fresh id: ``torchstep
            run``). An :class:`Attempt` without a try number on Kubernetes attaches to the
            logical attempt's running or finished Jobs and starts afresh after a failed one
            (:meth:`KubernetesStep.for_attempt`).
        cfg: the target's run options (``torchstep runopts local|kubernetes``).
        client: the Kubernetes client (kubernetes only; default: kubeconfig or in-cluster).
        on_line: receives every line of the step (each rank's, torchstep's notes).
        cursor_store: the orchestrator's state between tries (kubernetes only; see
            :class:`KubernetesStep`).
        options: the kind's own keyword arguments (:class:`LocalStep`: ``on_status``,
            ``app_id``, ``display``; :class:`KubernetesStep`: ``poll_interval``,
            ``on_finish``, ``result_file``).

    Returns:
        The step; ``run()`` blocks and returns the :class:`~torchstep.StepResult`.

    Raises:
        SpecError: a plan for another target (``kfp``: the KFP adapter runs its plan's step
            through ``local`` or ``kubernetes``), a bad attempt or option.
        RunError: the cluster could not give the attempt a run (not retryable: too many
            failed Jobs of it are kept, :meth:`KubernetesStep.for_attempt`).

    Example::

        step = open_step(plan, attempt=Attempt(("prefect", flow_run, task_key)), on_line=logger.info)
        result = step.run()
    """
    given = _attempt(attempt)
    if plan.target == "local":  # nothing on this machine outlives the worker: nothing to attach to
        return LocalStep(plan, run_id=_run_id(given), cfg=cfg, on_line=on_line, **options)
    if plan.target != "kubernetes":
        _plan_for(plan, "kubernetes")
    if isinstance(given, Attempt) and given.try_number is None:
        from torchstep.kubernetes.client import OfficialClient

        kube = client if client is not None else OfficialClient.from_config()
        step = KubernetesStep.for_attempt(plan, attempt_id=given.run_id, client=kube, cfg=cfg, on_line=on_line,
                                          cursor_store=cursor_store, **options)  # fmt: skip
    else:
        step = KubernetesStep(plan, run_id=_run_id(given), cfg=cfg, client=client, on_line=on_line,
                              cursor_store=cursor_store, **options)  # fmt: skip
        step.found = step.state() if given is not None else None
    if step.found is not None:
        step.say(f"the Jobs of {step.run_id} exist (an earlier try of this step created them): attaching")
    return step


def run_tries(
    plan: StepPlan,
    *,
    attempt: AttemptLike,
    cfg: Mapping[str, Any] | None = None,
    client: KubernetesClient | None = None,
    on_line: LineCallback | None = None,
    cursor_store: Any = None,
    retries: int | None = None,
    cancel: threading.Event | None = None,
    on_step: Callable[[LocalStep | KubernetesStep], object] | None = None,
    on_retry: Callable[[StepResult, int, float], None] | None = None,
    **options: Any,
) -> StepResult:
    """Run ``plan`` up to ``retries + 1`` times — the APPLICATION retry loop of an entry
    point that owns the budget itself — until it succeeds, is cancelled or fails
    non-retryably; each try is :func:`open_step` of its own attempt
    (:meth:`Attempt.again`), and ``attempts`` in the result counts them.

    Args:
        plan: the plan (local or kubernetes target).
        attempt: as :func:`open_step`: the first try's (try ``n``: :meth:`Attempt.again`).
        cfg: as :func:`open_step`; for the local target ``cfg["retries"]`` and
            ``cfg["retry_delay"]`` configure this loop.
        client: as :func:`open_step`.
        on_line: as :func:`open_step`.
        cursor_store: as :func:`open_step`.
        retries: how many retries at most; ``None``: ``cfg["retries"]``, else the plan's
            APPLICATION budget (``plan.step_retry.count``).
        cancel: set from any thread (or a signal handler): the running try stops every
            process, a wait for the next try ends, and the result is CANCELLED.
        on_step: called with each try's step before it runs, for an orchestrator whose kill
            arrives as a callback (it cancels the step; an interrupt leaves the stopped
            result in ``step.result``).
        on_retry: called with the failed result, its try number and the wait before the
            next try (the loop says it in the step's log itself).
        options: as :func:`open_step`.

    Returns:
        The last try's :class:`~torchstep.StepResult`.

    Raises:
        SpecError: as :func:`open_step`; anything that interrupts a try, after the try stopped.
        RunError: as :func:`open_step`.

    Example::

        result = run_tries(plan, attempt=Attempt(("kfp", job_id, task_id)), on_line=print)
    """
    cfg = dict(cfg or {})
    step_retry = plan.step_retry
    if plan.target == "local" and {"retries", "retry_delay"} & cfg.keys():
        from torchstep.local import resolve

        opts = resolve(cfg)
        retries = opts.retries if retries is None else retries
        step_retry = replace(
            step_retry, delay_s=opts.retry_delay if opts.retry_delay is not None else step_retry.delay_s
        )
        cfg.pop("retries", None)
        cfg.pop("retry_delay", None)
    retries = step_retry.count if retries is None else retries
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise SpecError("retries", plan.target, f"must be a whole number >= 0, got {retries!r}", fix="e.g. retries=2")
    delays = replace(step_retry, count=retries).delays(DEFAULT_RETRY_DELAY_S)
    app_id = options.pop("app_id", None)
    n = 1
    while True:
        step = open_step(plan, attempt=_again(attempt, n), cfg=cfg, client=client, on_line=on_line,
                         cursor_store=cursor_store, **options, **({"app_id": _again(app_id, n)} if app_id else {}))  # fmt: skip
        step.try_number = n
        if on_step is not None:
            on_step(step)
        result = _run_until_cancelled(step, cancel)
        # the one rule: never after SUCCEEDED or CANCELLED, nor after a non-retryable failure
        if not is_retryable(result.state, non_retryable=not result.retryable) or n > retries:
            if n > 1 or retries:
                step.say(f"{result.state} after {n} attempt(s) (at most {retries + 1})")
            return result
        delay = delays[n - 1]
        step.say(f"attempt {n} of {retries + 1} failed ({result.state}, exit code {result.exit_code}); "
                 f"retrying in {delay:g} s")  # fmt: skip
        if on_retry is not None:
            on_retry(result, n, delay)
        if (cancel or threading.Event()).wait(delay):  # a fresh Event: an interruptible sleep
            result.state, result.message = CANCELLED, "cancelled while waiting to retry"
            result.retryable = is_retryable(result.state)
            if isinstance(step, LocalStep) and result.log_dir:
                from torchstep.local.supervisor import write_run_result

                write_run_result(result, f"{result.log_dir}/result.json", step.display)
            return result
        n += 1


def _run_until_cancelled(step: LocalStep | KubernetesStep, cancel: threading.Event | None) -> StepResult:
    """``step.run()``, cancelled as soon as ``cancel`` is set (by a watcher thread)."""
    if cancel is None:
        return step.run()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(POLL_S):
                step.cancel()
                return

    if cancel.is_set():
        step.cancel()
    threading.Thread(target=watch, name="torchstep-cancel-watch", daemon=True).start()
    try:
        return step.run()
    finally:
        done.set()


def run_with_deadline(step: LocalStep | KubernetesStep, seconds: float | None) -> tuple[StepResult, bool]:
    """``step.run()``, the step cancelled (every process of it stopped) once ``seconds`` have
    passed: for an orchestrator whose own timeout cannot interrupt blocking code (Prefect's
    ``timeout_seconds`` in a worker thread raises only once the call returns).

    Args:
        step: the opened step (:func:`open_step`).
        seconds: the time it may run (``None`` or ``0``: no deadline here).

    Returns:
        The step result and whether the deadline passed (the step was cancelled).
    """
    expired = threading.Event()
    timer = None
    if seconds:

        def expire() -> None:
            expired.set()
            step.cancel()

        timer = threading.Timer(float(seconds), expire)
        timer.daemon = True
        timer.start()
    try:
        result = step.run()
    finally:
        if timer is not None:
            timer.cancel()
    return result, expired.is_set()


@contextlib.contextmanager
def stop_on_signals(
    cancel: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
) -> Iterator[list[int]]:
    """While inside, the first of ``signals`` sets ``cancel`` (:func:`run_tries` stops the
    step within its grace period) and a second raises ``KeyboardInterrupt`` (the step is
    killed at once); the previous handlers come back on the way out. Yields the signals
    received. In a thread other than the main one it installs nothing (the caller's own
    handlers decide).

    Args:
        cancel: the event the first signal sets.
        signals: the signals handled.

    Yields:
        The list of signals received so far (it grows while inside).

    Example::

        cancel = threading.Event()
        with stop_on_signals(cancel) as received:
            result = run_tries(plan, attempt=None, cancel=cancel)
    """
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        if len(received) > 1:
            raise KeyboardInterrupt  # a second signal: no more grace
        cancel.set()

    try:
        previous = {s: signal.signal(s, on_signal) for s in signals}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run_local(
    app: Any,
    *,
    cfg: Mapping[str, Any] | None = None,
    log_dir: str | None = None,
    on_status: Callable[[ReplicaEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> StepResult:
    """Run ``app`` (a TorchX ``AppDef``, or anything :func:`torchstep.materialize` takes)
    on this machine and block until it ends (``torchstep.run_local``).

    Args:
        app: the AppDef or component reference.
        cfg: the local run options (``torchstep runopts local``). Never retries the whole
            app unless ``cfg["retries"]`` says so: an orchestrator calling ``run_local``
            owns APPLICATION retries.
        log_dir: wins over ``cfg["log_dir"]``.
        on_status: called with a :class:`ReplicaEvent` on every replica state change.
        cancel: set from any thread: every process stops within the grace period and the
            result is CANCELLED. Ctrl-C does the same and re-raises once everything stopped.

    Returns:
        The step result, also written to ``<log_dir>/<app_id>/result.json``.

    Raises:
        SpecError: before anything starts, when the AppDef or this machine cannot serve it.

    >>> import torchstep
    >>> r = torchstep.run_local(torchstep.materialize("utils.sh", ["true"]), cfg={"tee": False})  # doctest: +SKIP
    >>> r.state, len(r.ranks)  # doctest: +SKIP
    ('SUCCEEDED', 1)
    """
    from torchstep.components.materialize import materialize
    from torchstep.plan.planner import build_plan

    cfg = {**(cfg or {}), **({"log_dir": log_dir} if log_dir is not None else {})}
    run_id = cfg.pop("run_id", None)
    return run_tries(build_plan(materialize(app), "local"), attempt=run_id, cfg=cfg, cancel=cancel,
                     on_status=on_status, retries=None if cfg.get("retries") is not None else 0)  # fmt: skip
