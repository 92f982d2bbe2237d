"""Apply a step plan to a KFP ``PipelineTask`` — the field map of the KFP adapter.

:func:`apply_plan` sets on a task the user built (any container component called inside a
``@dsl.pipeline``) every setting the AppDef implies, natively: cpu and memory requests and
limits, accelerator type and limit, ``set_retry`` from the plan's retry budget, env vars,
Secrets by reference (kfp-kubernetes ``use_secret_as_env``), PVC mounts, node selectors,
the step timeout, the pod name as an env var, the display name, and caching OFF unless
asked (training has side effects). What KFP cannot express (hostPath, devices, ports,
read-only claims) is refused by ``torchstep.build_plan(app, "kfp")`` with a SpecError
naming the field and the alternative, before anything is set.

Example::

    from kfp import dsl
    from torchstep_kfp import apply_plan

    @dsl.container_component
    def train():
        return dsl.ContainerSpec(image="ghcr.io/acme/train:1", command=["python", "-m", "train"])

    @dsl.pipeline
    def pipeline():
        apply_plan(train(), app)          # app: an AppDef, a component reference or a StepPlan
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torchstep import RolePlan, SpecError, StepPlan
from torchstep.adapter import INLINED_INTO, warn_inlined

from torchstep_kfp.entry import NAMESPACE_ENV, POD_NAME_ENV  # what the step reads, defined where it is read

TARGET = "kfp"
#: The launcher step's own resources (it only submits and watches Jobs).
LAUNCHER_CPU = "100m"
LAUNCHER_MEMORY = "512Mi"
#: The memory volume at /dev/shm (PyTorch DataLoader workers share tensors through it).
SHM_VOLUME = "dshm"
#: The accelerator a GPU count asks for when the role names none.
DEFAULT_ACCELERATOR = "nvidia.com/gpu"


def plan_of(app: Any) -> StepPlan:
    """``app`` as a KFP plan: a :class:`~torchstep.StepPlan` for target ``kfp`` as it is,
    else ``torchstep.build_plan(torchstep.materialize(app), "kfp")``.

    Args:
        app: a StepPlan, an AppDef, or a component reference (materialised with its defaults).

    Returns:
        The plan for target ``kfp``.

    Raises:
        SpecError: a plan for another target, or an AppDef the ``kfp`` target cannot express.
    """
    if isinstance(app, StepPlan):
        if app.target != TARGET:
            raise SpecError("plan", app.target, f"a plan for target {app.target!r}", fix='build_plan(app, "kfp")')
        return app
    from torchstep import build_plan, materialize

    return build_plan(materialize(app), TARGET)


def apply_plan(
    task: Any, app: Any, *, role: int | str = 0, caching: bool = False, launcher: bool = False, queued: bool = False
) -> Any:
    """Set every setting of ``role`` (its index or name) of ``app`` on ``task`` (a
    ``kfp.dsl.PipelineTask``); returns ``task``. See the module docstring for the map.

    ``launcher=True``: ``task`` is the launcher step of a multi-pod AppDef (it submits the
    pods as Jobs): it gets the retries, timeout, display name and caching, the pod's name and
    namespace as env vars, and small fixed resources — the roles' settings go to their pods.

    Args:
        task: a ``PipelineTask`` of a container component, called inside a ``@dsl.pipeline``.
        app: an AppDef, a component reference (run with its defaults) or a ``kfp`` StepPlan.
        role: the role whose settings are set: its index or name.
        caching: KFP's caching of the task (off by default: training has side effects).
        launcher: ``task`` is the launcher step of a multi-pod AppDef (see above).
        queued: the launcher's Jobs wait in a Kueue queue (the run option ``queue``): the
            launcher pod gets no timeout, since its ``activeDeadlineSeconds`` would count the
            wait for admission; the step timeout stays on the Jobs, counted from admission.

    Returns:
        ``task``, its settings set.

    Raises:
        SpecError: no such role, a task without a container, a field KFP cannot express, or
            a setting that needs kfp-kubernetes when it is not installed.
    """
    plan = plan_of(app)
    r = role_of(plan, role)
    warn_inlined(plan, INLINED_INTO[TARGET])
    with _container_checked(task):
        if launcher:
            return _launcher(task, plan, caching, queued)
        return _apply_role(task, plan, r, caching)


@contextmanager
def _container_checked(task: Any) -> Iterator[None]:
    """Check once that ``task`` runs a container, then let KFP's ``set_*`` methods skip that
    check: KFP makes it on every call with ``inspect.stack()``, which reads the source of
    every frame of the caller's stack — most of a pipeline's compile time, and more the
    deeper the call (ours is a few frames deeper than a hand-written ``set_*``). Same
    calls, same IR; only the repeated stack walk goes."""
    if getattr(task, "container_spec", None) is None:
        raise SpecError(
            "task",
            TARGET,
            f"{type(task).__name__} has no container to set a step's settings on",
            fix="apply_plan a task of a container component (@dsl.container_component or a torchstep component)",
        )
    own = vars(task)
    own[_CHECK] = _checked
    try:
        yield
    finally:
        own.pop(_CHECK, None)


_CHECK = "_ensure_container_spec_exists"


def _checked() -> None:
    """KFP's container check, made once by :func:`_container_checked`."""


def _apply_role(task: Any, plan: StepPlan, r: RolePlan, caching: bool) -> Any:
    res = r.resources
    if res.cpu is not None:
        task.set_cpu_request(f"{res.cpu:g}")
        task.set_cpu_limit(f"{res.cpu:g}")
    if res.mem_mb is not None:
        task.set_memory_request(f"{res.mem_mb}Mi")
        task.set_memory_limit(f"{res.mem_mb}Mi")
    if res.gpu:
        task.set_accelerator_type(DEFAULT_ACCELERATOR)
        task.set_accelerator_limit(res.gpu)
    _retry(task, plan)
    for key, value in sorted(r.env.items()):
        task.set_env_variable(key, value)
    task.set_display_name(r.name if len(plan.roles) > 1 else plan.app_name)
    task.set_caching_options(caching)
    _kubernetes(task, plan, r)
    return task


def _launcher(task: Any, plan: StepPlan, caching: bool, queued: bool = False) -> Any:
    task.set_cpu_request(LAUNCHER_CPU)
    task.set_memory_request(LAUNCHER_MEMORY)
    task.set_memory_limit(LAUNCHER_MEMORY)
    _retry(task, plan)
    task.set_display_name(plan.app_name)
    task.set_caching_options(caching)
    try:
        from kfp import kubernetes
    except ImportError:
        raise SpecError(
            "roles",
            TARGET,
            "a multi-pod step needs kfp-kubernetes (the launcher reads its namespace)",
            fix='pip install "torchstep-kfp[kubernetes]"',
        ) from None
    if plan.timeout_s is not None and not queued:  # queued: the Jobs' deadline counts from admission
        kubernetes.set_timeout(task, int(plan.timeout_s))
    kubernetes.use_field_path_as_env(task, env_name=POD_NAME_ENV, field_path="metadata.name")
    kubernetes.use_field_path_as_env(task, env_name=NAMESPACE_ENV, field_path="metadata.namespace")
    return task


def _retry(task: Any, plan: StepPlan) -> None:
    step = plan.step_retry
    if step.count:
        retry: dict[str, Any] = {"num_retries": step.count}
        if step.delay_s is not None:
            retry["backoff_duration"] = f"{round(step.delay_s)}s"
        if step.backoff is not None:
            retry["backoff_factor"] = float(step.backoff)
        if step.max_delay_s is not None:
            retry["backoff_max_duration"] = f"{round(step.max_delay_s)}s"
        task.set_retry(**retry)


def role_of(plan: StepPlan, role: int | str) -> RolePlan:
    """The role of ``plan`` with index or name ``role``; a SpecError listing the roles otherwise."""
    for i, r in enumerate(plan.roles):
        if role in (i, r.name):
            return r
    raise SpecError(
        "role",
        TARGET,
        f"no role {role!r} in app {plan.app_name!r}",
        fix=f"one of {[r.name for r in plan.roles]} or an index",
    )


def _kubernetes(task: Any, plan: StepPlan, r: RolePlan) -> None:
    """The kfp-kubernetes settings (a second document of the compiled pipeline)."""
    needed = []  # the fields that need kfp-kubernetes
    if r.secret_env:
        needed.append(f"roles[{r.index}].metadata['torchstep']['secret_env']")
    if any(m.kind == "volume" for m in r.mounts):
        needed.append(f"roles[{r.index}].mounts")
    if r.resources.capabilities:
        needed.append(f"roles[{r.index}].resource.capabilities")
    if plan.timeout_s is not None:
        needed.append("metadata['torchstep.timeout']")
    from torchstep_kfp.overlay import overlay_calls

    overlay = r.metadata.get("kubernetes")
    calls = overlay_calls(overlay, f"roles[{r.index}]") if overlay is not None else []
    if calls:
        needed.append(f"roles[{r.index}].metadata['kubernetes']")
    try:
        from kfp import kubernetes
    except ImportError:
        if needed:
            raise SpecError(
                needed[0],
                TARGET,
                "needs kfp-kubernetes, which is not installed",
                fix='pip install "torchstep-kfp[kubernetes]"',
            ) from None
        return  # nothing to set but the pod name env, which needs kfp-kubernetes (docs/kfp.md)
    by_secret: dict[str, dict[str, str]] = {}
    for ref in r.secret_env:
        by_secret.setdefault(ref.secret, {})[ref.key] = ref.env
    for secret, keys in sorted(by_secret.items()):
        kubernetes.use_secret_as_env(task, secret_name=secret, secret_key_to_env=keys)
    for m in r.mounts:
        if m.kind == "volume":  # build_plan refused every other kind for kfp
            kubernetes.mount_pvc(task, pvc_name=m.src, mount_path=m.dst)
    for key, value in sorted(r.resources.capabilities.items()):
        kubernetes.add_node_selector(task, label_key=key, label_value=str(value))
    if plan.timeout_s is not None:
        kubernetes.set_timeout(task, int(plan.timeout_s))
    for name, kwargs in calls:
        getattr(kubernetes, name)(task, **kwargs)
    if not any(m.dst == "/dev/shm" for m in r.mounts) and not any(
        name == "empty_dir_mount" and kw["mount_path"] == "/dev/shm" for name, kw in calls
    ):  # as on the kubernetes target: PyTorch workers share tensors through /dev/shm
        kubernetes.empty_dir_mount(task, volume_name=SHM_VOLUME, mount_path="/dev/shm", medium="Memory")
    kubernetes.use_field_path_as_env(task, env_name=POD_NAME_ENV, field_path="metadata.name")
