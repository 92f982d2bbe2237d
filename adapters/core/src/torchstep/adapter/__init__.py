"""The adapter SDK: the one part of core an orchestrator's adapter imports (besides the
top-level ``torchstep`` names), checked by import-linter.

Importing it is cheap (no torch, no TorchX, no planner): every name loads from its module
on first use, so a DAG file that imports an adapter stays cheap to parse. By idea:

- **A task** — :class:`StepTask` (a component or AppDef plus a target, planned once, its
  typed parameters, retry map and user-retry check), :class:`StepFailed`; the parse-time
  cache (``remember``, ``materialize_and_plan``); component parameters for an
  orchestrator's own signature (``parameters_of``, ``static_values``, ``task_function``, ...).
- **Running a try** — ``open_step`` / ``run_tries`` over a ``StepBackend``, ``Attempt``, and
  the helpers of the run-time seam (``torchstep.steps``): ``failure_summary``, ``check_user_retries``,
  ``run_with_deadline``, ``stop_on_signals``, ``step_run_id``.
- **Publishing** — :func:`publish` of a result's outputs, metrics and model through a
  :class:`Sink`, and the file helpers a sink writes with.
- **Names** — :mod:`torchstep.adapter.names`: orchestrator-safe identifiers and DNS names.
- **Fixed fields and secrets** — what an orchestrator fixes before run time and checks again
  (``step_fixed``, ``check_fixed``, ``several_pods``, ``waits_in_queue``), Secrets inlined into a compiled artifact
  (``warn_inlined``).
- **Untrusted AppDefs** — the policy of an AppDef from a run's conf (``Policy``,
  ``resolve_policy``, ``untrusted_cfg``, ``step_received``), Markdown escaping.
- **Kubernetes** — :mod:`torchstep.adapter.kubernetes`: rendering and ownership for an
  adapter that hands a pod to its orchestrator's own Kubernetes operator.
- **Processes** — ``stop_when_ancestors_die``, ``discard_output``, ``write_private``.

Example::

    >>> from torchstep.adapter import StepTask
    >>> task = StepTask("utils.echo", target="local", defaults={"msg": "hi"})
    >>> task.name, [p.name for p, _ in task.parameters][:1], task.retries
    ('echo', ['msg'], 0)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.lazy import lazy_names

# public name -> the module that defines it (loaded on first use)
_NAMES = {
    # a task
    "StepTask": "torchstep.adapter.task",
    "StepFailed": "torchstep.adapter.task",
    "ComponentParameter": "torchstep.components.builders",
    "UnknownParameterError": "torchstep.components.builders",
    "check_parameter_names": "torchstep.components.builders",
    "check_value": "torchstep.components.builders",
    "component_of": "torchstep.components.builders",
    "parameters_of": "torchstep.components.builders",
    "reference_of": "torchstep.components.builders",
    "static_values": "torchstep.components.builders",
    "task_function": "torchstep.components.builders",
    "unknown_parameter": "torchstep.components.builders",
    "app_from_dict": "torchstep.components.appjson",
    "app_to_dict": "torchstep.components.appjson",
    "check_cfg": "torchstep.cfg_table",
    "remember": "torchstep.components.plan_store",
    "materialize_and_plan": "torchstep.components.plan_cache",
    # running a try
    "Attempt": "torchstep.steps",
    "StepBackend": "torchstep.steps",
    "check_user_retries": "torchstep.steps",
    "failure_summary": "torchstep.steps",
    "open_step": "torchstep.steps",
    "run_tries": "torchstep.steps",
    "run_with_deadline": "torchstep.steps",
    "step_run_id": "torchstep.steps",
    "stop_on_signals": "torchstep.steps",
    "FAILED": "torchstep.result",
    "PENDING": "torchstep.result",
    "RUNNING": "torchstep.result",
    "SUCCEEDED": "torchstep.result",
    "root_cause_line": "torchstep.result",
    # publishing
    "Sink": "torchstep.adapter.outputs",
    "publish": "torchstep.adapter.outputs",
    "copy_out": "torchstep.outputs",
    "is_uri": "torchstep.outputs",
    "unpublished": "torchstep.outputs",
    "without_nulls": "torchstep.outputs",
    "write_out": "torchstep.outputs",
    # fixed fields and secrets
    "check_fixed": "torchstep.plan.fixed",
    "several_pods": "torchstep.plan.fixed",
    "step_fixed": "torchstep.plan.fixed",
    "waits_in_queue": "torchstep.plan.fixed",
    "INLINED_INTO": "torchstep.plan.secrets",
    "warn_inlined": "torchstep.plan.secrets",
    "warn_note": "torchstep.plan.secrets",
    # untrusted AppDefs
    "ENV_POLICY": "torchstep.policy",
    "Policy": "torchstep.policy",
    "PolicyError": "torchstep.policy",
    "untrusted_cfg": "torchstep.policy",
    "resolve_policy": "torchstep.adapter.received",
    "step_received": "torchstep.schedulers.generic",
    "escape_markdown": "torchstep.untrusted",
    "markdown_code": "torchstep.untrusted",
    # processes and files
    "discard_output": "torchstep.childproc",
    "stop_when_ancestors_die": "torchstep.childproc",
    "write_private": "torchstep.files",
    # an adapter package's own lazy names
    "lazy_names": "torchstep.lazy",
}

__all__ = [
    "ENV_POLICY",
    "FAILED",
    "INLINED_INTO",
    "PENDING",
    "RUNNING",
    "SUCCEEDED",
    "Attempt",
    "ComponentParameter",
    "Policy",
    "PolicyError",
    "Sink",
    "StepBackend",
    "StepFailed",
    "StepTask",
    "UnknownParameterError",
    "app_from_dict",
    "app_to_dict",
    "check_cfg",
    "check_fixed",
    "check_parameter_names",
    "check_user_retries",
    "check_value",
    "component_of",
    "copy_out",
    "discard_output",
    "escape_markdown",
    "failure_summary",
    "is_uri",
    "lazy_names",
    "markdown_code",
    "materialize_and_plan",
    "open_step",
    "parameters_of",
    "publish",
    "reference_of",
    "remember",
    "resolve_policy",
    "root_cause_line",
    "run_tries",
    "run_with_deadline",
    "several_pods",
    "static_values",
    "step_fixed",
    "step_received",
    "step_run_id",
    "stop_on_signals",
    "stop_when_ancestors_die",
    "task_function",
    "unknown_parameter",
    "unpublished",
    "untrusted_cfg",
    "waits_in_queue",
    "warn_inlined",
    "warn_note",
    "without_nulls",
    "write_out",
    "write_private",
]
__getattr__ = lazy_names(__name__, "torchstep", _NAMES)

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from torchstep.adapter.outputs import Sink, publish
    from torchstep.adapter.received import resolve_policy
    from torchstep.adapter.task import StepFailed, StepTask
    from torchstep.cfg_table import check_cfg
    from torchstep.childproc import discard_output, stop_when_ancestors_die
    from torchstep.components.appjson import app_from_dict, app_to_dict
    from torchstep.components.builders import (
        ComponentParameter,
        UnknownParameterError,
        check_parameter_names,
        check_value,
        component_of,
        parameters_of,
        reference_of,
        static_values,
        task_function,
        unknown_parameter,
    )
    from torchstep.components.plan_cache import materialize_and_plan
    from torchstep.components.plan_store import remember
    from torchstep.files import write_private
    from torchstep.outputs import copy_out, is_uri, unpublished, without_nulls, write_out
    from torchstep.plan.fixed import check_fixed, several_pods, step_fixed, waits_in_queue
    from torchstep.plan.secrets import INLINED_INTO, warn_inlined, warn_note
    from torchstep.policy import ENV_POLICY, Policy, PolicyError, untrusted_cfg
    from torchstep.result import FAILED, PENDING, RUNNING, SUCCEEDED, root_cause_line
    from torchstep.schedulers.generic import step_received
    from torchstep.steps import (
        Attempt,
        StepBackend,
        check_user_retries,
        failure_summary,
        open_step,
        run_tries,
        run_with_deadline,
        step_run_id,
        stop_on_signals,
    )
    from torchstep.untrusted import escape_markdown, markdown_code
