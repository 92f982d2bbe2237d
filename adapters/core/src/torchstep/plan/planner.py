"""AppDef → StepPlan: :func:`build_plan`, the one place where AppDef semantics are
decided, and :func:`plan_decisions`, the row per field behind :func:`torchstep.explain`.

The planner walks the app (name, metadata, roles) and hands each field group of a role to
its rule module in :mod:`torchstep.plan.rules`, a set of plain functions that record one
decision per field (honoured / warning / ignored / rejected) on a :class:`Recorder`:

- :mod:`~torchstep.plan.rules.command`: name, image, base_image, entrypoint, args, env, macros;
- :mod:`~torchstep.plan.rules.replicas`: num_replicas, min_replicas, processes per replica,
  a role's own torchrun;
- :mod:`~torchstep.plan.rules.resources`: resource, mounts, port_map;
- :mod:`~torchstep.plan.rules.retry`: max_retries, retry_policy and the retry layers;
- :mod:`~torchstep.plan.rules.metadata`: role metadata and its ``torchstep`` options,
  secrets, TorchX-nightly-only fields and fields of a newer TorchX.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    >>> plan = build_plan(app, target="kubernetes")
    >>> r = plan.roles[0]
    >>> (r.min_replicas, r.num_replicas, r.nproc_per_node, r.uses_torchrun)
    (2, 2, 2, True)
    >>> r.retry.owner.value  # max_retries=0: nobody retries
    'none'
    >>> sorted({d.action for d in plan_decisions(torchstep.materialize("utils.echo", []), "kfp")})
    ['honoured', 'warning']
    >>> [(w.field, w.fix[:30]) for w in plan.warnings]  # TorchX's default image has no torchstep
    [('roles[0].image', 'build an image FROM it with `p')]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from torchstep.errors import SpecError
from torchstep.plan.cmdline import parse_torchrun
from torchstep.plan.macros import find_macros, nested_strings
from torchstep.plan.model import (
    APP_OPTIONS,
    TARGETS,
    Decision,
    Mount,
    Port,
    RolePlan,
    SecretRef,
    StepPlan,
    step_retry_of,
)
from torchstep.plan.names import dns_label
from torchstep.plan.rules.command import becomes_macros, role_args, role_entrypoint, role_env, role_image, role_name
from torchstep.plan.rules.metadata import (
    nightly_fields,
    other_metadata,
    role_options,
    role_secret_env,
    unknown_fields,
)
from torchstep.plan.rules.record import Recorder, Rejected, Wording
from torchstep.plan.rules.replicas import role_launch, role_replicas
from torchstep.plan.rules.resources import role_mounts, role_ports, role_resources
from torchstep.plan.rules.retry import check_retry_layers, retry_options, role_retry, step_retries

__all__ = ["build_plan", "plan_decisions"]

#: What the app-level fields become on each target.
BECOMES: dict[str, Wording] = {
    "roles": {
        "local": "all roles start together on this machine; one rendezvous per role",
        "kubernetes": "one Pod (1 replica) or Indexed Job + headless Service per role",
        "kfp": "one container step for one pod; several roles or replicas: one launcher step running a Job per role",
    },
    "name": {
        "local": "app id {name}-<run id>; logs under <log_dir>/<app id>/",
        "kubernetes": "object name prefix {k8s_name!r} + run-unique suffix added at run time",
        "kfp": "display name {name!r}; launcher objects named {k8s_name!r} + run-unique suffix at run time",
    },
}

# Fields this rule book knows (TorchX 0.7 and nightly); any other dataclass field of a
# newer TorchX is rejected when set, noted when unset: never dropped silently.
APP_FIELDS = frozenset({"name", "roles", "metadata"})
ROLE_FIELDS = frozenset(
    {
        "name",
        "image",
        "min_replicas",
        "base_image",
        "entrypoint",
        "args",
        "env",
        "num_replicas",
        "max_retries",
        "retry_policy",
        "resource",
        "port_map",
        "metadata",
        "mounts",
        "workspace",  # nightly
        "overrides",  # nightly
    }
)
RESOURCE_FIELDS = frozenset({"cpu", "gpu", "memMB", "capabilities", "devices", "tags"})
T = TypeVar("T")


def plan_app(rec: Recorder) -> StepPlan | None:
    """Plan the whole app; ``None`` when a field was rejected (see ``decisions``).

    Args:
        rec: the recorder holding the AppDef and the target; every decision lands in it.

    Returns:
        The plan, or ``None`` when any field was rejected.
    """
    from torchx.specs import AppDef

    t = rec.target
    if not isinstance(t, str) or t not in TARGETS:
        rec.reject("target", t, f"unknown target {t!r}", f"use one of {', '.join(TARGETS)}")
        return None
    app = rec.app
    if not isinstance(app, AppDef):
        rec.reject(
            "app",
            type(app).__name__,
            "expected a torchx.specs.AppDef",
            "build one with torchstep.materialize(component, args)",
        )
        return None
    name, k8s_name = app_name(rec, app)
    timeout = app_metadata(rec, app)
    roles_in = getattr(app, "roles", None)
    if not isinstance(roles_in, list | tuple) or not roles_in:
        rec.reject("roles", roles_in, "an AppDef needs at least one role", "add a torchx.specs.Role")
        return None
    rec.ok("roles", f"{len(roles_in)} role(s)", rec.on_target(BECOMES["roles"]))
    roles = all_roles(rec, roles_in)
    check_retry_layers(rec, roles)
    step_retries(rec, step_retry_of(roles))
    unknown_fields(rec, "", app, APP_FIELDS)
    if rec.rejected:
        return None
    return StepPlan(
        app_name=name,
        k8s_name=k8s_name,
        target=t,
        roles=tuple(roles),
        timeout_s=timeout,
        decisions=tuple(rec.decisions),
        metadata=dict(app.metadata),
    )


def app_name(rec: Recorder, app: Any) -> tuple[str, str]:
    """Check the AppDef's name and derive its DNS-1123 form (at most 40 characters).

    Args:
        rec: the target and the decisions recorded so far.
        app: the ``torchx.specs.AppDef``.

    Returns:
        ``(name, k8s_name)``; a rejected name still returns a placeholder so planning goes on.
    """
    name = app.name
    t = rec.target
    if not isinstance(name, str) or not name.strip() or not name.isprintable() or any(c in name for c in "/\\"):
        rec.reject("name", name, "the AppDef needs a printable name without '/' or '\\'", "set AppDef(name='train')")
        return name if isinstance(name, str) else "", "app"
    k8s_name = dns_label(name, max_len=40)
    if not k8s_name and t != "local":
        rec.reject(
            "name",
            name,
            "no ASCII letter or digit to derive a Kubernetes-safe name from",
            "use a name with ASCII letters or digits",
        )
        return name, "app"
    k8s_name = k8s_name or "app"
    rec.ok("name", name, rec.on_target(BECOMES["name"], name=name, k8s_name=k8s_name))
    return name, k8s_name


def app_metadata(rec: Recorder, app: Any) -> float | None:
    """Check the AppDef's ``metadata``: ``torchstep.timeout`` is honoured, other
    ``torchstep*`` keys are rejected, the rest is informational.

    Args:
        rec: the target and the decisions recorded so far.
        app: the ``torchx.specs.AppDef``.

    Returns:
        The step timeout in seconds, or ``None`` when unset or rejected.
    """
    md = app.metadata
    if not isinstance(md, dict):
        rec.reject("metadata", md, "must be a dict of strings", "AppDef(metadata={'torchstep.timeout': '3600'})")
        return None
    if not md:
        rec.ok("metadata", {}, "none")
    timeout: float | None = None
    for key, value in md.items():
        path = f"metadata[{key!r}]"
        if key == "torchstep.timeout":
            timeout = rec.seconds(path, value)
            if timeout is not None:
                rec.ok(path, value, f"step timeout {timeout:g} s: every process of every role is stopped after it")
        elif isinstance(key, str) and key.startswith("torchstep"):
            rec.reject(path, value, f"unknown torchstep option {key!r}", f"use one of: {', '.join(APP_OPTIONS)}")
        else:
            rec.ignore(path, value, "AppDef metadata is informational for torchstep")
    return timeout


def all_roles(rec: Recorder, roles_in: list[Any] | tuple[Any, ...]) -> list[RolePlan]:
    """Plan every role; duplicate names (or names equal once made DNS-safe, off the local
    target) are rejected.

    Args:
        rec: the target and the decisions recorded so far.
        roles_in: the AppDef's ``roles``.

    Returns:
        The plans of the roles that were not rejected, in order.
    """
    roles: list[RolePlan] = []
    seen: dict[str, int] = {}
    seen_k8s: dict[str, int] = {}
    for i, role in enumerate(roles_in):
        try:
            rp = plan_role(rec, i, role)
        except Rejected:
            continue
        if rp.name in seen:
            rec.reject(
                f"roles[{i}].name",
                rp.name,
                f"duplicate role name (also roles[{seen[rp.name]}])",
                "give every role a unique name",
            )
            continue
        if rp.k8s_name in seen_k8s and rec.target != "local":
            rec.reject(
                f"roles[{i}].name",
                rp.name,
                f"maps to the same Kubernetes name {rp.k8s_name!r} as roles[{seen_k8s[rp.k8s_name]}]",
                "rename one of the roles (names that differ only in case or punctuation collide)",
            )
            continue
        seen[rp.name] = i
        seen_k8s[rp.k8s_name] = i
        roles.append(rp)
    return roles


def group(rule: Callable[[], T], default: T) -> T:
    """Run one field group's rule; ``default`` when it rejected its field.

    Args:
        rule: the rule, its arguments bound.
        default: the value to go on with after a rejection (the rejection is recorded).

    Returns:
        The rule's result, or ``default``.
    """
    try:
        return rule()
    except Rejected:
        return default


def plan_role(rec: Recorder, i: int, role: Any) -> RolePlan:
    """Plan one role: every field group's rule in turn.

    Args:
        rec: the target and the decisions recorded so far.
        i: the role's index in ``AppDef.roles`` (for field paths).
        role: the ``torchx.specs.Role``.

    Returns:
        The role's plan.

    Raises:
        Rejected: ``role`` is not a ``Role`` or a field the rest depends on was rejected
            (caught by :func:`all_roles`).
    """
    from torchx.specs import Role

    p = f"roles[{i}]"
    if not isinstance(role, Role):
        raise rec.fail(p, type(role).__name__, "expected a torchx.specs.Role", "build roles with torchx.specs.Role")
    name, k8s_name = role_name(rec, p, i, role)
    # Each group records its own rejections; later groups still run, so `explain`
    # shows every problem of the role at once.
    no_workdir: str | None = None
    image, workdir = group(lambda: role_image(rec, p, role), ("", no_workdir))
    entrypoint = group(lambda: role_entrypoint(rec, p, role), "")
    args: list[Any] = group(lambda: role_args(rec, p, role), [])
    env: dict[str, str] = group(lambda: role_env(rec, p, role), {})
    min_r, num_r = group(lambda: role_replicas(rec, p, role), (1, 1))
    opts: dict[str, Any] = group(lambda: role_options(rec, p, role), {})
    call = None
    if entrypoint and all(isinstance(a, str) for a in args):
        call = parse_torchrun(entrypoint, args)
    nproc = group(lambda: role_launch(rec, p, entrypoint, opts, call, num_r, min_r), 1)
    resources = group(lambda: role_resources(rec, p, role), None)
    mounts: list[Mount] = group(lambda: role_mounts(rec, p, role), [])
    ports: list[Port] = group(lambda: role_ports(rec, p, role), [])
    budget = group(lambda: role_retry(rec, p, role, call), None)
    if budget is not None:
        retry_options(rec, p, budget, opts)
    secrets: tuple[SecretRef, ...] = group(lambda: role_secret_env(rec, p, opts.get("secret_env"), env), ())
    group(lambda: other_metadata(rec, p, role), None)
    nightly_fields(rec, p, role)
    unknown_fields(rec, f"{p}.", role, ROLE_FIELDS)
    unknown_fields(rec, f"{p}.resource.", role.resource, RESOURCE_FIELDS)
    bound = [*args, *env.values(), *nested_strings(role.metadata)]
    macros = find_macros([a for a in bound if isinstance(a, str)])
    rec.ok(f"{p}.macros", sorted(m.value for m in macros), becomes_macros(rec, macros))
    if rec.rejected_under(p) or resources is None or budget is None:
        raise Rejected()
    return RolePlan(
        name=name,
        k8s_name=k8s_name,
        image=image,
        entrypoint=entrypoint,
        args=tuple(args),
        env=env,
        secret_env=secrets,
        min_replicas=min_r,
        num_replicas=num_r,
        nproc_per_node=nproc,
        uses_torchrun=call is not None,
        resources=resources,
        mounts=tuple(mounts),
        ports=tuple(ports),
        retry=budget,
        timeout_s=opts.get("timeout"),
        heartbeat_timeout_s=opts.get("heartbeat_timeout"),
        hang_timeout_s=opts.get("hang_timeout"),
        grace_period_s=opts.get("grace_period"),
        retry_delay_s=opts.get("retry_delay"),
        retry_backoff=opts.get("retry_backoff"),
        max_retry_delay_s=opts.get("max_retry_delay"),
        macros=macros,
        metadata=dict(role.metadata),
        workdir=workdir,
        index=i,
    )


def build_plan(app: Any, target: str) -> StepPlan:
    """Validate ``app`` (a ``torchx.specs.AppDef``) for ``target`` and normalise it.

    Deterministic: it never reads the environment, the clock or a random source, so the
    same AppDef gives an equal plan.

    Args:
        app: the ``torchx.specs.AppDef`` (e.g. from :func:`torchstep.materialize`).
        target: where the step runs: ``local``, ``kubernetes`` or ``kfp``.

    Returns:
        The plan every adapter and target maps to native calls.

    Raises:
        SpecError: the first field that cannot be honoured on ``target`` (an unknown
            target included); :func:`torchstep.explain` lists all of them.
    """
    rec = Recorder(app, target)
    plan = plan_app(rec)
    for d in rec.decisions:
        if d.action == "rejected":
            raise SpecError(d.field, target if d.field != "target" else None, d.becomes, fix=d.fix)
    if plan is None:  # pragma: no cover - the planner records a rejection whenever it gives up
        raise SpecError("app", target, "cannot be planned", fix="run `torchstep explain` on it")
    return plan


def plan_decisions(app: Any, target: str) -> list[Decision]:
    """Every decision for every field, rejected ones included (used by ``explain``).

    Args:
        app: the ``torchx.specs.AppDef``.
        target: ``local``, ``kubernetes`` or ``kfp``.

    Returns:
        One :class:`~torchstep.plan.model.Decision` per field, in the AppDef's order.

    >>> import torchstep
    >>> [d.action for d in plan_decisions(torchstep.materialize("utils.echo", []), "kfp")][:2]
    ['honoured', 'honoured']
    """
    rec = Recorder(app, target)
    plan_app(rec)
    return rec.decisions
