"""The local target — torchstep's embedded default: run an AppDef on this machine, every
replica of every role as one ``torchstep-agent`` process (see ``docs/local.md``).

Example::

    import torchstep

    app = torchstep.materialize("utils.sh", ["echo", "hello"])
    result = torchstep.run_local(app)  # blocks; output prefixed on stdout (torchstep.steps.run_local)
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

from torchstep.local.options import LocalOptions, cfg_table, resolve
from torchstep.local.status import PlainDisplay, ReplicaEvent, StatusCallback
from torchstep.plan.model import StepPlan
from torchstep.result import StepResult

__all__ = ["LocalOptions", "ReplicaEvent", "cfg_table", "resolve", "run_plan"]


def run_plan(
    plan: StepPlan,
    opts: LocalOptions,
    *,
    on_status: StatusCallback | None = None,
    cancel: threading.Event | None = None,
    kill: threading.Event | None = None,
    display: PlainDisplay | None = None,
    app_id: str | None = None,
    attempt: int = 1,
) -> StepResult:
    """Run a local ``plan`` once (one :class:`~torchstep.local.supervisor.Supervisor`): the
    engine of :class:`torchstep.steps.LocalStep`, which :func:`torchstep.run_local`, ``torchstep
    run`` and every adapter use (retries of the whole app: :func:`torchstep.steps.run_tries`).

    Args:
        plan: a plan for the local target.
        opts: the resolved run options (:func:`resolve`).
        on_status: called on every replica state change.
        cancel: set from any thread: every process stops within the grace period (CANCELLED).
        kill: set from any thread while stopping: SIGKILL at once, no more grace.
        display: where the lines go (default: printed).
        app_id: the run's app id (default: ``<app>-<hash of cfg run_id>``, else random).
        attempt: which try of the whole app this is (the result's ``attempts``).

    Returns:
        The step result, also written to ``<log_dir>/<app_id>/result.json``.

    The app id of a run with ``cfg["run_id"]`` is the one its Kubernetes objects would have:

    >>> import torchstep
    >>> from torchstep.plan.names import run_name
    >>> plan = torchstep.build_plan(torchstep.materialize("utils.sh", ["true"]), "local")
    >>> _app_id(plan, resolve({"run_id": "try-1"})) == run_name(plan.k8s_name, "try-1")
    True
    """
    from torchstep.local.supervisor import Supervisor

    supervisor = Supervisor(
        plan,
        opts,
        app_id=app_id or _app_id(plan, opts),
        on_status=on_status,
        cancel=cancel,
        kill=kill,
        display=display or PlainDisplay(show_output=opts.tee),
        attempt=attempt,
    )
    return supervisor.run()


def _app_id(plan: StepPlan, opts: LocalOptions) -> str | None:
    """With ``cfg["run_id"]``: ``<app>-<hash>`` as on Kubernetes (``None``: a random id)."""
    if opts.run_id is None:
        return None
    from torchstep.plan.names import run_name

    return run_name(plan.k8s_name, opts.run_id)
