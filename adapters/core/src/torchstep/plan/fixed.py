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

from collections.abc import Mapping
from typing import Any

from torchstep.plan.model import StepPlan

__all__ = ["STEP_FIELDS", "changed_fields", "fixed_fields"]

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
    possibly left out), in ``fixed``'s order, then ``now``'s."""
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
