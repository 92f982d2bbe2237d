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
from typing import Any

from torchstep.local.options import LocalOptions, resolve, runopts
from torchstep.local.status import PlainDisplay, ReplicaEvent, StatusCallback
from torchstep.result import CANCELLED, StepResult
from torchstep.spec.model import StepPlan

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
    from torchstep.spec.components import materialize
    from torchstep.spec.planner import build_plan

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
) -> StepResult:
    """Run a local ``plan`` up to ``retries + 1`` times (a new app id per attempt) until it
    succeeds, is cancelled or fails non-retryably; ``attempts`` in the result counts them.
    """
    from torchstep.local.launcher import Launcher

    cancel = cancel or threading.Event()
    display = display or PlainDisplay(show_output=opts.tee)
    delay = _first_delay(plan, opts)
    attempt = 1
    while True:
        app_id = _app_id(plan, opts, attempt)
        launcher = Launcher(
            plan, opts, app_id=app_id, on_status=on_status, cancel=cancel, display=display, attempt=attempt
        )
        result = launcher.run()
        if result.succeeded or result.state == CANCELLED or not result.retryable or attempt > retries:
            if attempt > 1 or retries:
                display.note(f"{result.state} after {attempt} attempt(s) (at most {retries + 1})")
            return result
        display.note(
            f"attempt {attempt} of at most {retries + 1} {result.state} (exit code {result.exit_code}); "
            f"retrying in {delay:g} s"
        )
        if cancel.wait(delay):
            result.state, result.retryable, result.message = CANCELLED, False, "cancelled while waiting to retry"
            result.write(f"{launcher.dir}/result.json")
            return result
        delay = _next_delay(plan, delay)
        attempt += 1


def _app_id(plan: StepPlan, opts: LocalOptions, attempt: int) -> str | None:
    """With ``cfg["run_id"]``: ``<app>-<hash>`` as on Kubernetes (``None``: a random id)."""
    if opts.run_id is None:
        return None
    from torchstep.spec.names import run_name

    return run_name(plan.k8s_name, opts.run_id if attempt == 1 else f"{opts.run_id}/attempt-{attempt}")


def _first_delay(plan: StepPlan, opts: LocalOptions) -> float:
    if opts.retry_delay is not None:
        return opts.retry_delay
    delays = [r.retry_delay_s for r in plan.roles if r.retry_delay_s is not None]
    return max(delays) if delays else 1.0


def _next_delay(plan: StepPlan, delay: float) -> float:
    factor = max((r.retry_backoff or 1.0 for r in plan.roles), default=1.0)
    caps = [r.max_retry_delay_s for r in plan.roles if r.max_retry_delay_s is not None]
    return min(delay * factor, min(caps)) if caps else delay * factor
