"""``torchstep.run_local``: an app (an AppDef, or anything :func:`torchstep.materialize`
takes) run on this machine, planned here and retried only when its cfg table says so."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torchstep.local.status import ReplicaEvent
from torchstep.steps.tries import run_tries

if TYPE_CHECKING:
    from torchstep.result import StepResult

__all__ = ["run_local"]


def run_local(
    app: Any,
    *,
    cfg: Mapping[str, Any] | None = None,
    log_dir: str | None = None,
    on_status: Callable[[ReplicaEvent], None] | None = None,
    cancel: threading.Event | None = None,
) -> StepResult:
    """Run ``app`` on this machine and block until it ends (``torchstep.run_local``).

    Args:
        app: a TorchX ``AppDef``, or anything :func:`torchstep.materialize` takes.
        cfg: the local cfg table (``torchstep runopts local``). Never retries the whole
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
    from torchstep.components.builders import materialize
    from torchstep.plan.planner import build_plan

    options = {**(cfg or {}), **({"log_dir": log_dir} if log_dir is not None else {})}
    run_id = options.pop("run_id", None)
    retries = None if options.get("retries") is not None else 0
    plan = build_plan(materialize(app), "local")
    return run_tries(plan, attempt=run_id, cfg=options, cancel=cancel, on_status=on_status, retries=retries)
