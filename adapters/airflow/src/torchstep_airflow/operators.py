"""``AppDefOperator``: a TorchX AppDef as an Airflow task, run under torchstep's agent.

Example::

    from airflow.sdk import DAG
    from torchstep_airflow import AppDefOperator
    from components.train import trainer

    with DAG("train", params={"lr": 0.1}, schedule=None):
        AppDefOperator(task_id="train", app=trainer, app_args={"lr": "{{ params.lr }}", "j": "2x2"})
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred
from torchstep import RunError, SpecError
from torchstep.adapter import INLINED_INTO, waits_in_queue, warn_inlined, warn_note

from torchstep_airflow.settings import UserSettings, attempt_of, check_run_settings, run_id_of, task_settings

if TYPE_CHECKING:
    from torchstep import StepPlan, StepResult

TARGETS = ("local", "kubernetes")
#: What computes a task's parse-time settings: part of their key in the plan store.
_CODE_FILES = (__file__, sys.modules["torchstep_airflow.settings"].__file__ or "")
#: Jinja markers of Airflow's default template environment.
_JINJA = ("{{", "{%", "{#")


class AppDefOperator(BaseOperator):
    """Run a TorchX AppDef as one Airflow task, every replica under torchstep's agent.

    Retries, retry timing and the step timeout come from the AppDef (see
    :mod:`torchstep_airflow.settings`); ``retries`` that contradicts it is a SpecError.
    XCom ``return_value`` is the step result (``StepResult.to_dict()``), pushed on failure
    too; a non-retryable failure raises ``AirflowFailException`` (no Airflow retry), and so
    does a :class:`~torchstep.SpecError` (bad input) or a :class:`~torchstep.RunError` that
    says retrying cannot help; any other ``RunError`` (the cluster failed the run) is raised
    as is, for Airflow to retry.

    Args:
        app: a ``torchx.specs.AppDef``, a component function, or a component reference
            (``"path/file.py:fn"``, ``"package.module:fn"``, a TorchX builtin like ``"dist.ddp"``).
        app_args: the component's arguments: a list of command-line strings
            (``["--lr", "0.1"]``, parsed by TorchX like ``torchx run``) or a mapping of parameter
            to value. Templated: ``{{ params.lr }}``, ``{{ ds }}``, ``{{ run_id }}`` and XComArgs
            work. The AppDef is built after rendering, at execute time; an AppDef's own args are
            never templates (a literal ``{{`` reaches the process as is).
        target: ``"local"`` (the processes run in the Airflow worker) or ``"kubernetes"``.
        cfg: options of the target (``torchstep runopts local|kubernetes``). Templated.
        kubernetes_kwargs: target ``kubernetes`` only: arguments of the
            KubernetesPodOperator that runs a 1-replica app (``kubernetes_conn_id``,
            ``on_finish_action``, ``startup_timeout_seconds``, ...); an app with several
            replicas or roles runs as Jobs and takes the connection arguments,
            ``on_finish_action`` and ``poll_interval``. ``deferrable`` here is an alias of
            the argument below.
        deferrable: target ``kubernetes`` only: wait for the run in Airflow's triggerer
            instead of a worker slot. The Jobs (or the pod) are created by the worker, the
            task defers to a trigger that polls their state asynchronously, and a worker
            resumes it at the end: it prints every rank's log lines, collects the result (the
            same XCom) and cleans up as ``on_finish_action`` says. The 1-replica path uses the
            KubernetesPodOperator's own ``deferrable``. Default: Airflow's
            ``[operators] default_deferrable`` (False). ``kubernetes_kwargs["deferrable"]`` is
            an alias (a different value in both is a SpecError). Not templated.
        durable: target ``kubernetes`` only (default True): a retry after the worker died
            (crash, SIGKILL, lost node) reattaches to the pod or Job of the earlier try instead
            of starting a second one — its logs continue, a Job that succeeded meanwhile returns
            its result without running again. Jobs use Airflow's ``ResumableJobMixin`` and the
            task state store (key ``torchstep_run_id``); a 1-replica pod uses the
            KubernetesPodOperator's ``reattach_on_restart``. See docs/kubernetes.md, "What
            happens when the watcher dies". ``False``: every try starts its own pod or Job.
            Not templated. The local target ignores it (its processes die with the worker).
        retries: Airflow's retries of the task; unset: the AppDef's (APPLICATION ``max_retries``).
        retry_delay: the delay before a retry (a timedelta or seconds); unset: the AppDef's.
        retry_exponential_backoff: the delay's factor per retry; unset: the AppDef's ``retry_backoff``.
        max_retry_delay: the cap of the retry delay (a timedelta or seconds); unset: the AppDef's.
        execution_timeout: Airflow's limit of one try, not under the step timeout; unset: that plus 60 s.
        kwargs: the other ``BaseOperator`` arguments (``task_id``, ``pool``, ...).

    Raises:
        SpecError: a bad input, an AppDef that cannot be planned for ``target`` (a DAG import
            error), or retry settings that contradict the AppDef.

    Example::

        AppDefOperator(task_id="train", app="dist.ddp",
                       app_args=["-j", "2x2", "--script", "train.py"], target="local")
    """

    template_fields: Sequence[str] = ("app_args", "cfg")
    #: Retries of the whole app inside one try of the task (``run_tries``): none, Airflow
    #: retries the task (``None``: the AppDef's APPLICATION budget, for the generic DAG).
    own_retries: int | None = 0
    template_fields_renderers = {"app_args": "py", "cfg": "py"}
    shallow_copy_attrs: Sequence[str] = ("app",)
    ui_color = "#f9d5c8"
    ui_fgcolor = "#ee4c2c"

    def __init__(
        self,
        *,
        app: Any,
        app_args: Sequence[Any] | Mapping[str, Any] | None = None,
        target: str = "local",
        cfg: Mapping[str, Any] | None = None,
        kubernetes_kwargs: Mapping[str, Any] | None = None,
        durable: bool = True,
        deferrable: bool | None = None,
        retries: int | None = None,
        retry_delay: timedelta | float | None = None,
        retry_exponential_backoff: float | None = None,
        max_retry_delay: timedelta | float | None = None,
        execution_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        _check_inputs(app, app_args, target, cfg)
        self.app = app
        self.app_args = app_args
        self.target = target
        self.cfg = dict(cfg or {})
        if kubernetes_kwargs and target != "kubernetes":
            raise SpecError("kubernetes_kwargs", target, "only the kubernetes target uses them", fix="remove them")
        self.kubernetes_kwargs = dict(kubernetes_kwargs or {})
        if not isinstance(durable, bool):
            raise SpecError("durable", target, f"must be True or False, got {durable!r}", fix="durable=False")
        self.durable = durable
        self.deferrable = _deferrable(deferrable, self.kubernetes_kwargs, target)
        self._user = UserSettings(retries, retry_delay, retry_exponential_backoff, max_retry_delay, execution_timeout)
        # Plan now when the inputs are static: a bad AppDef is a DAG import error, and the
        # retry budget must be known now (the scheduler reads `retries` from the parsed DAG).
        self._parsed: dict[str, Any] | None = self._parse_time_settings()
        given: dict[str, Any] = {
            "retries": retries,
            "retry_delay": retry_delay,
            "retry_exponential_backoff": retry_exponential_backoff,
            "max_retry_delay": max_retry_delay,
            "execution_timeout": execution_timeout,
        }
        given.update(self._parsed or {})
        super().__init__(**{k: v for k, v in given.items() if v is not None}, **kwargs)
        self._runner: Any = None  # the step of the running try (see use_step)
        self._killed = False

    # -- building the AppDef ----------------------------------------------------------------
    def _component(self) -> tuple[Any, Sequence[Any] | Mapping[str, Any] | None]:
        """The component and its (rendered or not) arguments."""
        return self.app, self.app_args

    def _parse_time_settings(self) -> dict[str, Any] | None:
        """The task settings the plan implies (None: no plan before rendering), or the
        SpecError that makes the DAG an import error. Kept across processes for a string
        reference or a module-level function (``torchstep.components.plan_store``): a
        re-parse of an unchanged DAG file imports neither TorchX nor the planner."""
        from torchstep.adapter import remember

        def compute() -> tuple[dict[str, Any], list[str]]:
            plan = self._parse_time_plan()
            if plan is None:
                return {"parsed": None, "note": None, "app": None}, []
            # the pod spec becomes the task's rendered fields
            note = warn_inlined(plan, INLINED_INTO[self.target]) if self.target == "kubernetes" else None
            parsed = task_settings(plan, self._user, self.target, waits_in_queue(self.target, self.cfg))
            images = [role.image for role in plan.roles] if self.target == "local" else []
            return {"parsed": parsed, "note": note, "app": plan.app_name}, images

        component, args = self._component()
        key = {
            "args": args,
            "target": self.target,
            "user": list(vars(self._user).values()),
            "queued": waits_in_queue(self.target, self.cfg),
        }
        outcome = remember(f"airflow:{type(self).__qualname__}", component, key, compute, _CODE_FILES)
        if outcome["note"]:  # kept: say it again (once per process, as warn_inlined does)
            warn_note(outcome["note"], outcome["app"])
        return outcome["parsed"]  # type: ignore[no-any-return]

    def _parse_time_plan(self) -> StepPlan | None:
        component, args = self._component()
        if _is_appdef(component) or not _templated(args):
            return _plan(component, args, self.target)
        # Templated arguments are unknown until the task runs. Plan with stand-ins, only to
        # read the retry budget now: the component's defaults for them, else "0" (which
        # TorchX parses as str, int, float or bool). execute() checks the rendered AppDef.
        # The names are not templates: a name the component lacks is a DAG import error.
        from torchstep.adapter import UnknownParameterError, check_parameter_names

        if isinstance(args, Mapping):
            check_parameter_names(component, args)
        for stand_in in _stand_ins(args):
            try:
                return _plan(component, stand_in, self.target)
            except UnknownParameterError:
                raise
            except SpecError:
                continue
        return None

    def build_app(self) -> tuple[Any, StepPlan]:
        """The AppDef of this try (after template rendering) and its plan."""
        component, args = self._component()
        return _build(component, args, self.target)

    # -- running ------------------------------------------------------------------------------
    def execute(self, context: Any) -> dict[str, Any]:
        plan = self._checked_plan()
        self.log.info(
            "torchstep: running app %r (run id %s) on target %s", plan.app_name, run_id_of(context), self.target
        )
        return self._run(plan, context)

    def trigger_reentry(self, context: Any, event: dict[str, Any], **carried: Any) -> dict[str, Any]:
        """Resume a deferred KubernetesPodOperator run (a 1-replica app, ``deferrable=True``).

        Args:
            context: the task's Airflow context.
            event: the KubernetesPodTrigger's event.
            carried: what the try kept through the deferral
                (``torchstep_airflow.kubernetes.DEFERRAL_KWARG``: its pod, its preemptions).

        Returns:
            The step result (XCom ``return_value``).
        """
        return self._run(self._checked_plan(check=False), context, {**event, **carried})

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Resume a deferred Job run (several replicas or roles, ``deferrable=True``): reattach
        to its Jobs, print the ranks' log lines, collect, clean up, report as ``execute`` does.

        Args:
            context: the task's Airflow context.
            event: the payload of :class:`torchstep_airflow.triggers.JobGangTrigger`'s event.

        Returns:
            The step result (XCom ``return_value``).
        """
        return self._run(self._checked_plan(check=False), context, {**event, "resumed_jobs": True})

    def _checked_plan(self, *, check: bool = True) -> StepPlan:
        try:
            plan = self.build_app()[1]
            if check:
                check_run_settings(plan, self._user, self.target, self._parsed, self)
        except SpecError as e:
            raise AirflowFailException(f"torchstep: {e}") from e
        return plan

    def _run(self, plan: StepPlan, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        """One try of the step: opened through core's seam (``open_step``), its lines in the
        task log, then :meth:`finish`."""
        self._runner, self._killed = None, False
        try:
            if self.target == "local":  # ranks' lines: printed into the task log
                from torchstep.adapter import run_tries

                result = run_tries(
                    plan,
                    attempt=attempt_of(context),
                    cfg=self.cfg,
                    retries=self.own_retries,
                    on_step=self.use_step,
                    on_retry=self.on_retry,
                )
            else:
                from torchstep_airflow.kubernetes import run_kubernetes

                result = run_kubernetes(self, plan, context, event)
        except SpecError as e:
            raise AirflowFailException(f"torchstep: {e}") from e
        except RunError as e:  # the cluster failed the run: Airflow retries it, unless it says that cannot help
            if not e.retryable:
                raise AirflowFailException(f"torchstep: {e} (not retryable)") from e
            raise
        except (TaskDeferred, Exception):  # deferred (trigger_reentry resumes), or the step failed and
            raise  # cleaned up as configured (on_finish_action)
        except BaseException:  # execution timeout, termination, Ctrl-C: stop everything, keep the result
            from torchstep.adapter import failure_summary

            stopped = self._stop()
            if stopped is not None and self.do_xcom_push:
                context["ti"].xcom_push(key="return_value", value=stopped.to_dict())
                self.log.error("torchstep: stopped: %s", failure_summary(stopped))
            raise
        finally:
            self._runner = None
        return self.finish(result, context)

    def on_retry(self, result: StepResult, attempt: int, delay: float) -> None:
        """A try inside this task failed and another follows (only where ``own_retries``)."""

    def use_step(self, step: Any) -> Any:
        """Make ``step`` (anything with ``cancel()``) the one :meth:`on_kill` stops; cancelled
        at once when a kill came first."""
        self._runner = step
        if self._killed:  # set before reading it, as on_kill does: one of the two sees the other
            step.cancel()
        return step

    def _stop(self) -> StepResult | None:
        runner = self._runner
        if runner is None:
            return None
        runner.cancel()
        return getattr(runner, "result", None)

    def finish(self, result: StepResult, context: Any) -> dict[str, Any]:
        """Return the result as XCom, or push it and raise the matching Airflow exception."""
        data = result.to_dict()
        if result.succeeded:
            self.log.info(
                "torchstep: %s succeeded (%.1f s, %d restart(s))", result.app_id, result.duration_s, result.restarts
            )
            return data
        from torchstep.adapter import failure_summary

        if self.do_xcom_push:
            context["ti"].xcom_push(key="return_value", value=data)
        summary = failure_summary(result)
        self.log.error("torchstep: %s", summary)
        if not result.retryable:
            raise AirflowFailException(f"torchstep: {summary} (not retryable)")
        raise AirflowException(f"torchstep: {summary}")

    def on_kill(self) -> None:
        """Task cleared, marked failed or timed out: stop every process of the step."""
        self._killed = True
        if self._runner is not None:
            self.log.warning("torchstep: stopping the step (task killed)")
            self._stop()


# -- helpers ---------------------------------------------------------------------------------
def _is_appdef(app: Any) -> bool:
    # An AppDef exists only if the DAG file imported torchx: no import here.
    specs = sys.modules.get("torchx.specs")
    return specs is not None and isinstance(app, specs.AppDef)


def _templated(value: Any) -> bool:
    """Whether ``value`` holds a Jinja template or an XComArg (rendered at run time)."""
    if isinstance(value, str):
        return any(m in value for m in _JINJA)
    if isinstance(value, Mapping):
        return any(_templated(v) for v in value.values())
    if isinstance(value, list | tuple | set):
        return any(_templated(v) for v in value)
    return hasattr(value, "resolve") and hasattr(value, "iter_references")  # XComArg / ResolveMixin


def _stand_ins(args: Sequence[Any] | Mapping[str, Any] | None) -> list[Any]:
    """Arguments to plan with at parse time, templated values replaced (see above)."""
    if isinstance(args, Mapping):
        static = {k: v for k, v in args.items() if not _templated(v)}
        return [static, {k: "0" if _templated(v) else v for k, v in args.items()}]
    if isinstance(args, list | tuple):
        return [["0" if _templated(v) else v for v in args]]
    return []


def _build(component: Any, args: Any, target: str) -> tuple[Any, StepPlan]:
    from torchstep import build_plan, materialize

    app = materialize(component, None if _is_appdef(component) else args)
    return app, build_plan(app, target)


def _plan(component: Any, args: Any, target: str) -> StepPlan:
    """The plan while the DAG file is parsed: identical tasks (same component, arguments and
    target) are planned once per parse (a fresh copy each); execute() builds afresh."""
    from torchstep.adapter import materialize_and_plan

    if _is_appdef(component):
        return _build(component, args, target)[1]
    plan: StepPlan = materialize_and_plan(component, args, target)[1]
    return plan


def _deferrable(given: bool | None, kubernetes_kwargs: dict[str, Any], target: str) -> bool:
    """``deferrable``, from the argument, its alias ``kubernetes_kwargs["deferrable"]`` (taken
    out of them) or Airflow's ``[operators] default_deferrable``, as the provider's operators do."""
    alias = kubernetes_kwargs.pop("deferrable", None)
    for name, value in (("deferrable", given), ("kubernetes_kwargs['deferrable']", alias)):
        if value is not None and not isinstance(value, bool):
            raise SpecError(name, target, f"must be True or False, got {value!r}", fix="deferrable=True")
    if given is not None and alias is not None and given != alias:
        raise SpecError(
            "kubernetes_kwargs['deferrable']",
            target,
            f"contradicts deferrable={given}",
            fix="set only deferrable= on the AppDefOperator",
        )
    explicit = given if given is not None else alias
    if explicit and target != "kubernetes":
        raise SpecError(
            "deferrable", target, "only the kubernetes target defers (a local run lives in the worker)", fix="remove it"
        )
    if explicit is not None:
        return explicit
    if target != "kubernetes":
        return False
    from airflow.configuration import conf

    return conf.getboolean("operators", "default_deferrable", fallback=False)


def _check_inputs(app: Any, app_args: Any, target: str, cfg: Any) -> None:
    if target not in TARGETS:
        raise SpecError("target", None, f"unknown target {target!r}", fix=f"use one of: {', '.join(TARGETS)}")
    if not (isinstance(app, str) or callable(app) or _is_appdef(app)):
        raise SpecError(
            "app",
            target,
            f"expected an AppDef, a component function or a reference string, got {type(app).__name__}",
            fix='e.g. app="components/train.py:trainer" or app=trainer',
        )
    if app_args is not None and not isinstance(app_args, Mapping | list | tuple) and not _templated(app_args):
        raise SpecError(
            "app_args",
            target,
            f"must be a list of strings or a mapping, got {type(app_args).__name__}",
            fix='app_args=["--lr", "0.1"] or app_args={"lr": 0.1}; never one shell string',
        )
    if _is_appdef(app) and app_args:
        raise SpecError(
            "app_args", target, "arguments were given with a ready AppDef", fix="pass the component function instead"
        )
    if cfg is not None and not isinstance(cfg, Mapping):
        raise SpecError("cfg", target, f"must be a mapping, got {type(cfg).__name__}", fix='cfg={"log_dir": "/data"}')
    if cfg is not None:
        from torchstep.adapter import check_cfg

        # every key now; a templated value once it is rendered (a None stands in for it)
        check_cfg({k: None if _templated(v) else v for k, v in cfg.items()}, target)
