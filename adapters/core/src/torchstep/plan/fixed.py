"""The fields of a plan that an orchestrator fixes before run time, and the one rule that
checks them again at run time: a field whose run-time value differs from the fixed one is
never dropped silently — the step fails at once, naming the field.

KFP fixes a task's image, resources, mounts, Secrets, node selectors, pod overlay, retries,
timeout and shape when the pipeline is compiled; Airflow fixes a task's retries and timeout
when the DAG is parsed. Both plan with the values known then, keep :func:`fixed_fields` of
that plan, and compare it with the run-time plan's through :func:`changed_fields`.

Example::

    >>> import torchstep
    >>> from torchx import specs
    >>> def app(mounts):
    ...     return specs.AppDef("t", roles=[specs.Role("t", image="img", entrypoint="python", mounts=mounts)])
    >>> compiled = fixed_fields(torchstep.build_plan(app([]), "kfp"), role=0)
    >>> now = fixed_fields(torchstep.build_plan(app([specs.VolumeMount("ckpt", "/ckpt")]), "kfp"), role=0)
    >>> changed_fields(compiled, now)
    [('roles[0].mounts', [], ['volume ckpt -> /ckpt'])]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torchstep.errors import SpecError
from torchstep.plan.model import StepPlan

__all__ = ["STEP_FIELDS", "changed_fields", "check_fixed", "fixed_fields", "several_pods", "step_fixed"]

#: The step's own fixed fields (every role's are named ``roles[i]....``).
STEP_FIELDS = ("max_retries", "retry_delay", "retry_backoff", "max_retry_delay", "metadata['torchstep.timeout']")


def fixed_fields(plan: StepPlan, *, role: int | None = None) -> dict[str, Any]:
    """The fields of ``plan`` an orchestrator may fix before run time, by the AppDef field
    path that decides each, as plain JSON data (comparable after a round trip through a
    compiled pipeline).

    Args:
        plan: the plan.
        role: also the fields of this role (its index) that a task running that role's
            container fixes: image, resources, mounts, Secrets, node selectors, pod overlay.

    Returns:
        ``{field path: value}``.
    """
    step = plan.step_retry
    out: dict[str, Any] = {
        "max_retries": step.count,
        "retry_delay": step.delay_s,
        "retry_backoff": step.backoff,
        "max_retry_delay": step.max_delay_s,
        "metadata['torchstep.timeout']": plan.timeout_s,
    }
    if role is not None:
        r = plan.roles[role]
        p = f"roles[{r.index}]"
        res = r.resources
        out |= {
            f"{p}.image": r.image,
            f"{p}.resource": {"cpu": res.cpu, "gpu": res.gpu, "memMB": res.mem_mb, "devices": dict(res.devices)},
            f"{p}.resource.capabilities": {str(k): str(v) for k, v in res.capabilities.items()},
            f"{p}.mounts": [f"{m.kind} {m.src} -> {m.dst}" + (" ro" if m.read_only else "") for m in r.mounts],
            f"{p}.metadata['torchstep']['secret_env']": {s.env: f"{s.secret}/{s.key}" for s in r.secret_env},
            f"{p}.metadata['kubernetes']": r.metadata.get("kubernetes"),
        }
    return out


def changed_fields(fixed: Mapping[str, Any], now: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(field, fixed value, run-time value)`` of every field whose value differs between
    ``fixed`` and ``now`` (both from :func:`fixed_fields`, fields that are unset or empty
    possibly left out), in ``fixed``'s order, then ``now``'s.

    Args:
        fixed: the fields fixed before run time.
        now: the same fields of the run-time plan.

    Returns:
        One ``(field, fixed value, run-time value)`` per difference (a missing field: ``None``).
    """
    keys = [*fixed, *(k for k in now if k not in fixed)]
    return [(k, fixed.get(k), now.get(k)) for k in keys if _plain(fixed.get(k)) != _plain(now.get(k))]


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples as lists, ints and floats alike; unset
    and empty alike)."""
    if value is None or value == [] or value == {} or value == ():
        return None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return value


def several_pods(plan: StepPlan) -> bool:
    """Whether the step needs several pods (several roles, or a role with several or elastic
    replicas): an orchestrator that runs a step in one container then runs a launcher that
    submits the pods as Jobs (:mod:`torchstep.kubernetes`).

    Args:
        plan: the plan.

    Returns:
        ``True`` for several pods, ``False`` for one container.
    """
    return len(plan.roles) > 1 or any(r.num_replicas > 1 or r.min_replicas != r.num_replicas for r in plan.roles)


def waits_in_queue(target: str, cfg: Any) -> bool:
    """Whether a step's Kubernetes objects wait for Kueue's admission: the kubernetes target
    with the run option ``queue``. Its own timeout (the Jobs' ``activeDeadlineSeconds``)
    counts from admission, so an orchestrator derives no timeout of its own from it (Airflow's
    ``execution_timeout``, a KFP launcher pod's deadline): that one would count the wait.

    Args:
        target: the step's target.
        cfg: its run options (anything else than a mapping: none).

    Returns:
        ``True`` for the kubernetes target with ``queue`` set.

    >>> waits_in_queue("kubernetes", {"queue": "team-a"}), waits_in_queue("local", {"queue": "team-a"})
    (True, False)
    """
    return target == "kubernetes" and isinstance(cfg, Mapping) and bool(cfg.get("queue"))


def step_fixed(plan: StepPlan, *, role: int = 0) -> dict[str, Any]:
    """What a task of one step fixes before run time: the step's shape (``one_container`` or
    ``several_pods``), retries and timeout, and for a one-container step the fields of its
    role ``role`` (a launcher's roles run as Jobs made at run time). Unset fields are left
    out (:func:`changed_fields` takes a missing field for an unset one).

    Args:
        plan: the plan.
        role: the role a one-container step runs (its index).

    Returns:
        ``{"shape": ..., field path: value}``.
    """
    pods = several_pods(plan)
    fields = fixed_fields(plan, role=None if pods else role)
    unset: tuple[Any, ...] = (None, [], {})
    return {"shape": "several_pods" if pods else "one_container", **{k: v for k, v in fields.items() if v not in unset}}


def check_fixed(
    fixed: Mapping[str, Any],
    planned_with: Mapping[str, Any],
    values: Mapping[str, Any],
    now: Mapping[str, Any],
    fixed_with: Callable[[Mapping[str, Any]], Mapping[str, Any] | None],
    *,
    target: str,
    orchestrator: str,
    when: str,
    fixed_as: str,
    fix_constant: str,
    fix_shape: str,
) -> None:
    """The one rule: the run-time plan of a step leaves the fields its orchestrator fixed
    before run time as they were, or the step fails at once naming the field and the input
    that changed it (the orchestrator would run it with the fixed value, silently).

    Args:
        fixed: the fixed fields (:func:`step_fixed`) of the plan made before run time.
        planned_with: the input values that plan was made with.
        values: the run-time input values.
        now: the fixed fields of the run-time plan.
        fixed_with: the fixed fields of the plan of other input values (``None``: those
            values alone make no plan); used to tell which input changed a field.
        target: the SpecError's target.
        orchestrator: who fixed the fields (``KFP``).
        when: when it fixed them (``compile time``).
        fixed_as: how a value fixed then is called (``compiled``).
        fix_constant: the fix for a changed field, a format string given ``names`` (the
            inputs, quoted) and ``first`` (the first input's name, or ``name``).
        fix_shape: the fix for a changed shape.

    Raises:
        SpecError: a fixed field differs, naming the field (``inputs`` for the shape).
    """
    changed = changed_fields(fixed, now)
    if not changed:
        return
    field, before, after = changed[0]
    inputs = [k for k in planned_with if k in values and values[k] != planned_with[k]]
    if len(inputs) > 1:  # the inputs that change this field on their own
        alone = [k for k in inputs if (fixed_with({**planned_with, k: values[k]}) or {}).get(field) != before]
        inputs = alone or inputs
    said = (
        ", ".join(f"{k}={values[k]!r} ({fixed_as} with {planned_with[k]!r})" for k in inputs) or "the run-time inputs"
    )
    if field == "shape":
        raise SpecError(
            "inputs",
            target,
            f"with these input values ({said}) the AppDef needs {after.replace('_', ' ')}, "
            f"but the pipeline was {fixed_as} for the other shape, {before.replace('_', ' ')} ({orchestrator} "
            f"fixes a step's shape at {when})",
            fix=fix_shape,
        )
    names = " or ".join(repr(k) for k in inputs) or "the inputs"
    shown = [repr(v) if v is not None else "none" for v in (before, after)]
    raise SpecError(
        field,
        target,
        f"{orchestrator} fixed it at {when} to {shown[0]}, but the run-time input(s) {said} "
        f"make it {shown[1]}; the step would run with the {fixed_as} value",
        fix=fix_constant.format(names=names, first=inputs[0] if inputs else "name"),
    )
