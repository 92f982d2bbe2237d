"""The local target — torchstep's embedded default: run an AppDef on this machine, every
replica of every role as one ``torchstep-agent`` process (see ``docs/local.md``).

Example::

    import torchstep

    app = torchstep.materialize("utils.sh", ["echo", "hello"])
    result = torchstep.run_local(app)  # blocks; output prefixed on stdout
    assert result.state == "SUCCEEDED"
    print(result.app_status())         # TorchX AppStatus, roles and replicas included

Stop a run from another thread (what an Airflow ``on_kill`` does)::

    cancel = threading.Event()
    worker = threading.Thread(target=lambda: torchstep.run_local(app, cancel=cancel))
    worker.start()
    cancel.set()   # every agent gets SIGTERM, then SIGKILL after the grace period
    worker.join()  # the result says CANCELLED
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from torchstep.local.options import LocalOptions, resolve, runopts
from torchstep.local.status import PlainDisplay, ReplicaEvent, StatusCallback
from torchstep.plan.model import StepPlan
from torchstep.result import CANCELLED, StepResult

__all__ = ["LocalOptions", "ReplicaEvent", "run_local", "run_plan", "runopts"]


def run_local(
    app: Any,
    *,
    cfg: Mapping[str, Any] | None = None,
    log_dir: str | None = None,
    on_status: StatusCallback | None = None,
    cancel: threading.Event | None = None,
) -> StepResult:
    """Run ``app`` (a TorchX ``AppDef``, or anything :func:`torchstep.materialize` takes)
    on this machine and block until it ends.

    ``cfg`` holds the options of :func:`runopts` (``torchstep runopts local``); ``log_dir``
    wins over ``cfg["log_dir"]``. ``on_status(event)`` is called with a
    :class:`ReplicaEvent` on every replica state change. Setting ``cancel`` (from any thread)
    stops every process within the grace period and returns a CANCELLED result; Ctrl-C
    (KeyboardInterrupt) does the same and re-raises once everything is stopped.

    Never retries the whole app unless ``cfg["retries"]`` says so: an orchestrator calling
    ``run_local`` owns APPLICATION retries. Raises :class:`~torchstep.SpecError` before
    starting anything when the AppDef or this machine cannot serve it. The result is also
    written to ``<log_dir>/<app_id>/result.json``.

    >>> import torchstep
    >>> r = torchstep.run_local(torchstep.materialize("utils.sh", ["true"]), cfg={"tee": False})  # doctest: +SKIP
    >>> r.state, len(r.ranks)  # doctest: +SKIP
    ('SUCCEEDED', 1)
    """
    from torchstep.components.materialize import materialize
    from torchstep.plan.planner import build_plan

    plan = build_plan(materialize(app), "local")
    opts = resolve(cfg, log_dir=log_dir)
    return run_plan(plan, opts, retries=opts.retries or 0, on_status=on_status, cancel=cancel)


def run_plan(
    plan: StepPlan,
    opts: LocalOptions,
    *,
    retries: int = 0,
    on_status: StatusCallback | None = None,
    cancel: threading.Event | None = None,
    display: PlainDisplay | None = None,
    app_id: str | None = None,
) -> StepResult:
    """Run a local ``plan`` up to ``retries + 1`` times (a new app id per attempt) until it
    succeeds, is cancelled or fails non-retryably; ``attempts`` in the result counts them.
    ``app_id`` names the first attempt (``<app_id>-attempt-<n>`` the later ones) when the
    caller must know the run directories in advance (the ``torchstep_local`` scheduler).
    """
    from torchstep.local.launcher import Launcher

    cancel = cancel or threading.Event()
    display = display or PlainDisplay(show_output=opts.tee)
    delays = retry_delays(plan, opts, retries)
    attempt = 1
    while True:
        launcher = Launcher(
            plan,
            opts,
            app_id=attempt_id(app_id, attempt) if app_id else _app_id(plan, opts, attempt),
            on_status=on_status,
            cancel=cancel,
            display=display,
            attempt=attempt,
        )
        result = launcher.run()
        if result.succeeded or result.state == CANCELLED or not result.retryable or attempt > retries:
            if attempt > 1 or retries:
                display.note(f"{result.state} after {attempt} attempt(s) (at most {retries + 1})")
            return result
        display.note(
            f"attempt {attempt} of at most {retries + 1} {result.state} (exit code {result.exit_code}); "
            f"retrying in {delays[attempt - 1]:g} s"
        )
        if cancel.wait(delays[attempt - 1]):
            from torchstep.local.launcher import write_run_result

            result.state, result.retryable, result.message = CANCELLED, False, "cancelled while waiting to retry"
            write_run_result(result, f"{launcher.dir}/result.json", display)
            return result
        attempt += 1


def attempt_id(app_id: str, attempt: int) -> str:
    """The app id of ``attempt`` of a run whose first attempt is ``app_id``."""
    return app_id if attempt == 1 else f"{app_id}-attempt-{attempt}"


def _app_id(plan: StepPlan, opts: LocalOptions, attempt: int) -> str | None:
    """With ``cfg["run_id"]``: ``<app>-<hash>`` as on Kubernetes (``None``: a random id)."""
    if opts.run_id is None:
        return None
    from torchstep.plan.names import run_name

    return run_name(plan.k8s_name, opts.run_id if attempt == 1 else f"{opts.run_id}/attempt-{attempt}")


def retry_delays(plan: StepPlan, opts: LocalOptions, retries: int) -> list[float]:
    """The wait before each of ``retries`` retries: the plan's one rule
    (:meth:`~torchstep.plan.model.StepRetry.delays`) with ``cfg["retry_delay"]`` for the
    first wait when given, else the AppDef's, else 1 s.

    >>> import torchstep
    >>> from torchx import specs
    >>> role = specs.Role("w", image="", entrypoint="true", max_retries=3,
    ...                   metadata={"torchstep": {"retry_delay": 2, "retry_backoff": 3, "max_retry_delay": 10}})
    >>> plan = torchstep.build_plan(specs.AppDef("a", roles=[role]), "local")
    >>> retry_delays(plan, resolve({}), 3)
    [2.0, 6.0, 10.0]
    """
    step = plan.step_retry
    first = opts.retry_delay if opts.retry_delay is not None else step.delay_s
    return replace(step, count=retries, delay_s=first).delays(1.0)
