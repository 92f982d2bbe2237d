"""Rules for ``Role.max_retries`` and ``Role.retry_policy``: one retry budget per role,
spent by exactly one layer (the table is :data:`torchstep.plan.model.RETRY_OWNERS`, applied
by :func:`torchstep.plan.model.retry_budget`), and never two layers across roles or inside a
role's own torchrun. Part of the rule book behind :func:`torchstep.build_plan`.

Example::

    >>> from torchx.specs import Role, RetryPolicy
    >>> rec = Recorder(app=None, target="kfp")
    >>> role = Role("t", image="img", entrypoint="python", max_retries=2, retry_policy=RetryPolicy.REPLICA)
    >>> role_retry(rec, "roles[0]", role, None).agent_restarts
    2
    >>> rec.decisions[-1].becomes
    'agent --max-restarts 2 inside the step; no set_retry'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from torchstep.errors import SpecError
from torchstep.plan.cmdline import TorchrunCall, positive_int
from torchstep.plan.limits import MAX_RETRIES
from torchstep.plan.model import (
    RETRY_OWNERS,
    RetryBudget,
    RetryOwner,
    RolePlan,
    StepPlan,
    StepRetry,
    policy_name,
    retry_budget,
)
from torchstep.plan.rules.record import Recorder, Wording, is_int

#: What a role's retry budget becomes on each target, per owner.
BECOMES: dict[str, Wording] = {
    RetryOwner.ORCHESTRATOR.value: {
        "local": "{n} retries of the whole app by the caller (orchestrator, or `torchstep run`); agent 0",
        "kubernetes": "{n} retries of the whole step by the orchestrator; Job backoffLimit 0, agent 0",
        "kfp": "set_retry({n}) on the role's task; agent restarts 0",
    },
    RetryOwner.AGENT.value: {
        "local": "agent --max-restarts {n}; a lost replica is replaced from the same budget",
        "kubernetes": "agent --max-restarts {n}; lost pods replaced via backoffLimitPerIndex; "
        "podFailurePolicy fails the Job on the agent's final exit codes",
        "kfp": "agent --max-restarts {n} inside the step; no set_retry",
    },
    RetryOwner.ROLE.value: {
        "local": "{n} restarts of every replica of the role by the local supervisor",
        "kubernetes": "Job backoffLimit {n} for the role (every replica restarts)",
        "kfp": "{n} restarts of the role's Job by the launcher step",
    },
    "step_retries": {
        "local": "the caller (orchestrator, or `torchstep run`) waits {delays} before retry 1..{n}",
        "kubernetes": "the orchestrator waits {delays} before retry 1..{n} (Airflow retry_delay / "
        "retry_exponential_backoff / max_retry_delay, Prefect retry_delay_seconds)",
        "kfp": "set_retry({n}, backoff_duration, backoff_factor, backoff_max_duration): waits {delays}",
    },
}

#: Role options that only the orchestrator's retries use.
ORCHESTRATOR_RETRY_OPTIONS = ("retry_delay", "retry_backoff", "max_retry_delay")


def role_retry(rec: Recorder, p: str, role: Any, call: TorchrunCall | None) -> RetryBudget:
    """The role's budget and its owner, per target.

    Args:
        rec: the target and the decisions recorded so far.
        p: the role's field path (``roles[0]``).
        role: the ``torchx.specs.Role``.
        call: the role's own torchrun (if any), whose ``--max-restarts`` must agree with the budget.

    Returns:
        The role's retry budget.

    Raises:
        Rejected: ``max_retries`` or ``retry_policy`` is invalid (recorded as a rejection).
    """
    mr = getattr(role, "max_retries", None)
    if not is_int(mr) or not 0 <= mr <= MAX_RETRIES:
        raise rec.fail(f"{p}.max_retries", mr, f"must be an integer in 0..{MAX_RETRIES}", "e.g. 2")
    pol = getattr(role, "retry_policy", None)
    name = policy_name(pol)
    if name is None:
        raise rec.fail(
            f"{p}.retry_policy",
            pol,
            f"unknown retry policy {pol!r}",
            f"use torchx.specs.RetryPolicy, one of: {', '.join(RETRY_OWNERS)}",
        )
    budget = retry_budget(name, mr)
    rec.ok(f"{p}.max_retries", mr, f"retry budget owned by: {budget.owner.value}")
    what = "no retries" if budget.owner is RetryOwner.NONE else rec.on_target(BECOMES[budget.owner.value], n=mr)
    if name == "HOT_SPARE":
        what += " (HOT_SPARE: spares beyond min_replicas join the elastic rendezvous)"
    if call is not None and budget.owner is RetryOwner.AGENT:
        what = what.replace(
            f"agent --max-restarts {mr}", f"PET_MAX_RESTARTS={mr} for the role's own torchrun (run as the agent)"
        )
    rec.ok(f"{p}.retry_policy", name, what)
    if call is not None:
        env = role.env if isinstance(role.env, dict) else {}
        torchrun_restarts(rec, p, budget, call, env.get("PET_MAX_RESTARTS"))
    return budget


def torchrun_restarts(rec: Recorder, p: str, budget: RetryBudget, call: TorchrunCall, pet: Any) -> None:
    """A role that runs its own torchrun: its ``--max-restarts`` (or ``PET_MAX_RESTARTS``
    in the role's env) is a retry layer too. It may carry the agent's budget, never
    disagree with it, and never add to another owner's.

    Args:
        rec: the target and the decisions recorded so far.
        p: the role's field path.
        budget: the role's retry budget.
        call: the role's torchrun command line.
        pet: ``PET_MAX_RESTARTS`` from the role's env, if set.
    """
    given, where = (call.max_restarts, "args") if call.max_restarts is not None else (pet, "env['PET_MAX_RESTARTS']")
    if given is None:
        return  # the launchers pass the agent's budget as PET_MAX_RESTARTS
    path = f"{p}.{where}"
    restarts = positive_int(given, MAX_RETRIES) if isinstance(given, str) else None
    if restarts is None and given != "0":
        rec.reject(path, given, f"max restarts {given!r} is not a number the planner can check", "write the number")
        return
    restarts = restarts or 0
    if budget.owner is RetryOwner.AGENT and restarts != budget.count:
        rec.reject(
            path,
            f"max restarts {given}",
            f"the role's torchrun sets max restarts {given} while its {budget.policy} budget is {budget.count}",
            f"set it in one place: max_retries={restarts}, or remove it from the role's torchrun",
        )
    elif budget.owner in (RetryOwner.ORCHESTRATOR, RetryOwner.ROLE) and restarts:
        rec.reject(
            path,
            f"max restarts {given}",
            f"the role's torchrun restarts workers {restarts} time(s) and the {budget.owner.value} retries "
            f"{budget.count} time(s): one failure would be retried by two layers",
            f"remove it from the role's torchrun, or use RetryPolicy.REPLICA with max_retries={restarts}",
        )
    elif budget.owner is RetryOwner.NONE and restarts:
        rec.ok(
            path,
            f"max restarts {given}",
            f"the role's own torchrun restarts workers {restarts} time(s) (its only retry layer)",
        )


def retry_options(rec: Recorder, p: str, budget: RetryBudget, opts: Mapping[str, Any]) -> None:
    """retry_delay / retry_backoff / max_retry_delay only mean something when the
    orchestrator owns the budget: otherwise they are noted as ignored.

    Args:
        rec: the target and the decisions recorded so far.
        p: the role's field path.
        budget: the role's retry budget.
        opts: the role's ``metadata["torchstep"]`` options, already parsed.
    """
    for key in ORCHESTRATOR_RETRY_OPTIONS:
        if key not in opts:
            continue
        path = f"{p}.metadata['torchstep'][{key!r}]"
        value = opts[key]
        if budget.owner is not RetryOwner.ORCHESTRATOR:
            rec.ignore(
                path,
                value,
                f"only used for orchestrator retries (APPLICATION policy); this role's budget is "
                f"owned by: {budget.owner.value}",
            )
        elif rec.target == "local":
            rec.ok(path, value, f"{key} of the caller's retries (orchestrator, or `torchstep run`)")
        else:
            what = {
                "retry_delay": f"orchestrator retry delay {value:g} s (KFP: set_retry backoff_duration)",
                "retry_backoff": f"orchestrator retry delay multiplier {value:g} (KFP: backoff_factor)",
                "max_retry_delay": f"orchestrator retry delay cap {value:g} s (KFP: backoff_max_duration)",
            }[key]
            rec.ok(path, value, what)


def check_retry_layers(rec: Recorder, roles: list[RolePlan]) -> None:
    """Across roles: an orchestrator-owned budget (the whole step restarts) cannot be
    mixed with a role or agent that retries itself; APPLICATION budgets that differ
    are resolved to the largest, and the row says so.

    Args:
        rec: the target and the decisions recorded so far.
        roles: the planned roles.
    """
    owners: dict[RetryOwner, RolePlan] = {}
    for r in roles:
        if r.retry.owner is not RetryOwner.NONE:
            owners.setdefault(r.retry.owner, r)
    if RetryOwner.ORCHESTRATOR in owners and len(owners) > 1:
        a = owners[RetryOwner.ORCHESTRATOR]
        b = next(r for o, r in owners.items() if o is not RetryOwner.ORCHESTRATOR)
        rec.reject(
            f"roles[{b.index}].retry_policy",
            b.retry.policy,
            f"role {a.name!r} retries the whole step ({a.retry.policy}, {a.retry.count}) while role "
            f"{b.name!r} retries itself ({b.retry.policy}, {b.retry.count}): one failure of "
            f"{b.name!r} would be retried by two layers",
            "use one retry policy for every role, or set max_retries=0 on one of them",
        )
        return
    if rec.target == "kfp" and len(roles) > 1:
        for r in roles:
            if r.retry.owner is RetryOwner.ORCHESTRATOR:
                rec.ok(
                    f"roles[{r.index}].retry_policy",
                    r.retry.policy,
                    "KFP retries this role's task alone: the tasks of the other roles are not restarted",
                )
    counts = {r.retry.count for r in roles if r.retry.owner is RetryOwner.ORCHESTRATOR}
    if len(counts) > 1:
        top = max(counts)
        for r in roles:
            if r.retry.owner is RetryOwner.ORCHESTRATOR and r.retry.count != top:
                rec.ok(
                    f"roles[{r.index}].max_retries",
                    r.retry.count,
                    f"the step is retried as a whole: {top} times, the largest APPLICATION budget of all roles",
                )


def step_retries(rec: Recorder, step: StepRetry) -> None:
    """The step's retries and the wait before each (:meth:`StepRetry.delays`, the one
    rule every target follows), as one row: ``retries``.

    Args:
        rec: the target and the decisions recorded so far.
        step: the step's retries (:attr:`StepPlan.step_retry`).
    """
    if not step.count:
        return
    waits = step.delays() if step.delay_s is not None else None
    shown = ", ".join(f"{w:g} s" for w in waits) if waits is not None else "the orchestrator's default delay"
    rec.ok("retries", step.count, rec.on_target(BECOMES["step_retries"], n=step.count, delays=shown))


# -- the user's orchestrator settings against the plan --------------------------------------
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

    Args:
        plan: the step's plan.
        retries: the task's retry count as the user set it; ``None``: not set.
        timeout: the task's timeout in seconds; ``None``: not set.
        retry_delay: the task's delay before a retry in seconds; ``None``: not set.
        retry_backoff: the task's delay multiplier per retry; ``None``: not set.
        max_retry_delay: the task's cap of the retry delay in seconds; ``None``: not set.
        orchestrator: the orchestrator's name, as the message says it (``"Prefect"``).

    Raises:
        SpecError: a setting that adds a second retry layer, contradicts the AppDef's
            timing, or a timeout shorter than the step's.

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
        raise SpecError(
            "retries",
            target,
            f"the task's retries must be a whole number >= 0, got {retries!r}",
            fix="e.g. retries=2, or leave it out: the AppDef's max_retries decides",
        )
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
            raise SpecError(
                "timeout",
                target,
                f"the task's timeout {timeout!r} is not a positive number of seconds",
                fix="e.g. 3600",
            )
        if plan.timeout_s is not None and timeout < plan.timeout_s:
            raise SpecError(
                "metadata['torchstep.timeout']",
                target,
                f"{orchestrator}'s timeout of {timeout:g} s would kill the step before its own timeout of "
                f"{plan.timeout_s:g} s stops it cleanly",
                fix="set one timeout: drop the task's, or lower torchstep.timeout",
            )
