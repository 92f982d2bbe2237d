"""What an orchestrator's TorchX scheduler sends the orchestrator's generic step (the
``airflow`` scheduler a run of the generic DAG, ``prefect`` a flow run of the generic flow)
and what that step checks on arrival, written once for both: the data
(``{"app": <AppDef as JSON>, "target": ..., "cfg": ...}``, :func:`step_conf`) and its
check (:func:`step_received`), the step's run options checked before submitting
(:func:`check_step_cfg`), and the root cause of a step result the orchestrator keeps
(:func:`result_message`).

Example::

    >>> from torchx import specs
    >>> app = specs.AppDef("a", roles=[specs.Role("w", image="", entrypoint="echo", args=["hi"])])
    >>> step_received(step_conf(app, "local", {}), field="conf", what="the DAG run", scheduler="airflow")[2]
    'local'
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from torchx.specs import AppDef

from torchstep.errors import SpecError
from torchstep.schedulers.base import STEP_TARGETS, app_payload, app_received

__all__ = ["check_step_cfg", "result_message", "step_conf", "step_received"]


def step_conf(
    app: AppDef, target: str, cfg: Mapping[str, Any], *, app_id: str | None = None, plan: Any = None
) -> dict[str, Any]:
    """What an orchestrator scheduler sends its generic step (a DAG run's conf, a flow run's
    parameters): ``{"app": <AppDef as JSON>, "target": ..., "cfg": ...}``, the AppDef checked
    for ``target`` (:func:`app_payload`); the other end is :func:`app_received`.

    Args:
        app: the AppDef.
        target: ``local`` or ``kubernetes``.
        cfg: the step's run options.
        app_id: the handle ``torchx run`` prints: the TorchX job id macro in the roles' env
            (``TORCHX_JOB_ID``) becomes it, not the id of one try.
        plan: ``app``'s plan for ``target`` when the caller made it (then not made again).

    Returns:
        The JSON data.

    Raises:
        SpecError: a field of the AppDef the target cannot run.
    """
    if plan is None:
        payload = app_payload(app, target)
    else:
        from torchstep.components.appjson import app_to_dict

        payload = app_to_dict(app)
    if app_id is not None:
        from torchx.specs import macros

        for role in payload["roles"]:
            job_id = (role.get("env") or {}).get("TORCHX_JOB_ID")
            if isinstance(job_id, str):
                role["env"]["TORCHX_JOB_ID"] = job_id.replace(macros.app_id, app_id)
    return {"app": payload, "target": target, "cfg": dict(cfg)}


def check_step_cfg(
    app: AppDef, target: str, cfg: Mapping[str, str], run_id: str, *, field: str, plan: Any = None
) -> None:
    """What a generic step checks of its run options before it starts: the target's options,
    with the step made here and never run (:mod:`torchstep.steps`).

    Args:
        app: the AppDef.
        target: ``local`` or ``kubernetes``.
        cfg: the step's run options.
        run_id: the run id the step would have.
        field: what the options are called in the scheduler's ``cfg`` (``cfg['step_cfg']``).
        plan: ``app``'s plan for ``target`` when the caller made it (then not made again).

    Raises:
        SpecError: a bad option, named ``<field>[<key>]``.
    """
    from torchstep.plan.planner import build_plan
    from torchstep.steps import KubernetesStep, LocalStep

    try:
        plan = plan if plan is not None else build_plan(app, target)
        (LocalStep if target == "local" else KubernetesStep)(plan, run_id=run_id, cfg=cfg)
    except SpecError as e:
        if not e.field.startswith("cfg["):
            raise
        raise SpecError(field + e.field.removeprefix("cfg"), e.target, e.problem, fix=e.fix) from None


def result_message(value: Any) -> str:
    """The root cause of a failed step result an orchestrator keeps (a task's return value,
    as JSON data or its text): ``""`` for a success or anything that is not a step result.

    Args:
        value: the step result (:meth:`torchstep.result.StepResult.to_dict`), or its JSON text.

    Returns:
        :func:`torchstep.steps.failure_summary` of a failed result, else ``""``.
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return ""
    if not isinstance(value, dict):
        return ""
    from torchstep.result import StepResult
    from torchstep.steps import failure_summary

    try:
        result = StepResult.from_dict(value)
    except (KeyError, TypeError, ValueError):
        return ""
    return "" if result.succeeded else failure_summary(result)


def step_received(
    conf: Any, policy: Any = None, *, field: str | None, what: str, scheduler: str
) -> tuple[AppDef, Any, str, dict[str, Any]]:
    """The other end of :func:`step_conf`: what an orchestrator's generic step received (a
    DAG run's conf, a flow run's parameters), checked before anything is created — its keys,
    the target, the run options, and the AppDef by :func:`app_received` (its fields, its plan,
    the deployment's policy).

    Args:
        conf: ``{"app": <AppDef as JSON>, "target": ..., "cfg": {...}}``.
        policy: a :class:`torchstep.policy.Policy`, the path of its TOML file, or ``None``:
            the file ``TORCHSTEP_POLICY`` names, else ``torchstep.policy.DEFAULT``.
        field: what ``conf`` is called in errors (``conf``: ``conf['target']``); ``None``: its
            keys are named alone (``target``), each a parameter of its own.
        what: what carries it, for the error of a missing AppDef (``the DAG run``).
        scheduler: the TorchX scheduler that sends it (the fix of that error).

    Returns:
        The AppDef, its plan, the target and the run options.

    Raises:
        SpecError: a bad key or field, named (``conf['app'].roles[0].entrypoint``).
        torchstep.policy.PolicyError: a field the policy does not allow.
    """

    def name(key: str) -> str:
        return f"{field}[{key!r}]" if field else key

    if not isinstance(conf, Mapping) or "app" not in conf:
        raise SpecError(
            name("app"),
            None,
            f"{what} carries no AppDef",
            fix=f"trigger it with `torchx run -s {scheduler}` ({field or 'parameters'} {{'app': <AppDef as JSON>}})",
        )
    unknown = sorted(set(conf) - {"app", "target", "cfg"})
    if unknown:
        raise SpecError(name(unknown[0]), None, "unknown key", fix="use only app, target, cfg")
    target = conf.get("target") or "local"
    if target not in STEP_TARGETS:
        raise SpecError(
            name("target"), None, f"unknown target {target!r}", fix=f"use one of: {', '.join(STEP_TARGETS)}"
        )
    cfg = conf.get("cfg") or {}
    if not isinstance(cfg, Mapping):
        raise SpecError(
            name("cfg"), target, f"must be a mapping, got {type(cfg).__name__}", fix='e.g. {"timeout": 600}'
        )
    app, plan = app_received(conf["app"], target, cfg, policy, field=name("app"), name_target=field is None)
    return app, plan, target, dict(cfg)
