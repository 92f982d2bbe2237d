"""The run-time seam: what every orchestrator adapter does with a plan, written once.

An adapter plans once (``torchstep.build_plan``), maps the plan's fields to its
orchestrator, and at run time calls one of these two:

- :func:`open_step`: the step of one try — a :class:`StepBackend`, :class:`LocalStep` or
  :class:`KubernetesStep`, picked from ``plan.target`` — named from the orchestrator's
  identity of the try (:class:`Attempt`), attached to the Jobs of an earlier try when they
  exist. Nothing runs, and no cluster is read, before its ``run()``.
- :func:`run_tries`: the one APPLICATION retry loop, for an entry point that owns the
  budget itself (``torchstep run``, the ``torchstep_local`` scheduler, the KFP launcher
  step under ``kfp.local``, Airflow's generic DAG): the plan's delays, the non-retryable
  verdict and cancellation.

And the rules around them: :func:`step_run_id` (a run id from the orchestrator's
identifiers), :func:`check_user_retries` (the task's own retries against the plan),
:func:`failure_summary` (the line adapters log and raise with), :func:`run_with_deadline`
and :func:`stop_on_signals` (stops from outside), :func:`run_local`.

One module per idea: ``ids`` (run ids, :class:`Attempt`), ``failure``, ``runner`` (the
cancellable runner under both kinds), ``backend`` (the :class:`StepBackend` protocol),
``local`` and ``kubernetes`` (the two kinds), ``dispatch`` (:func:`open_step`), ``tries``
(:func:`run_tries`), ``signals``, ``app`` (:func:`run_local`).

Example::

    >>> step_run_id("train", "fit", "manual__2026-11-21T10:00:00+00:00", "try2")
    'train.fit.manual-2026-11-21t10-00-00-00-00.try2-f5e55d'
    >>> Attempt(("train", "fit", "manual__1"), try_number=2).run_id
    'train.fit.manual-1.try2-0834f0'
"""

from __future__ import annotations

from torchstep.plan.rules.retry import check_user_retries
from torchstep.steps.app import run_local
from torchstep.steps.backend import StepBackend
from torchstep.steps.dispatch import open_step
from torchstep.steps.failure import failure_summary
from torchstep.steps.ids import Attempt, step_run_id
from torchstep.steps.kubernetes import KubernetesStep
from torchstep.steps.local import LocalStep
from torchstep.steps.signals import run_with_deadline, stop_on_signals
from torchstep.steps.tries import run_tries

__all__ = [
    "Attempt",
    "KubernetesStep",
    "LocalStep",
    "StepBackend",
    "check_user_retries",
    "failure_summary",
    "open_step",
    "run_local",
    "run_tries",
    "run_with_deadline",
    "step_run_id",
    "stop_on_signals",
]
