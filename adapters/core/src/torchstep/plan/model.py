"""The plan's vocabulary: frozen dataclasses, data only (:func:`torchstep.build_plan`
in :mod:`torchstep.plan.planner` fills them).

A :class:`StepPlan` is a TorchX AppDef validated and normalised for a target (``local``,
``kubernetes``, ``kfp``). Adapters and targets only map its fields to native calls; they
never look at the AppDef again.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    >>> plan = torchstep.build_plan(app, target="kubernetes")
    >>> r = plan.roles[0]
    >>> (r.min_replicas, r.num_replicas, r.nproc_per_node, r.uses_torchrun)
    (2, 2, 2, True)
    >>> r.retry.owner.value  # max_retries=0: nobody retries
    'none'
    >>> torchstep.build_plan(torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py", "--max_retries", "3"]),
    ...            target="kfp").orchestrator_retries
    3
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchstep.errors import SpecError
from torchstep.plan.limits import MAX_RETRIES
from torchstep.plan.macros import Macro, substitute, substitute_nested

__all__ = [
    "APP_OPTIONS",
    "RDZV_PORT_NAMES",
    "RETRY_OWNERS",
    "ROLE_OPTIONS",
    "TARGETS",
    "Decision",
    "Mount",
    "Port",
    "Resources",
    "RetryBudget",
    "RetryOwner",
    "RolePlan",
    "SecretRef",
    "StepPlan",
    "StepRetry",
    "retry_budget",
    "step_retry_of",
]

TARGETS = ("local", "kubernetes", "kfp")

#: Keys accepted in ``role.metadata["torchstep"]`` (typos are errors, not silently dropped).
ROLE_OPTIONS: dict[str, str] = {
    "nproc_per_node": "worker processes per replica (default 1, or torchrun's --nproc-per-node)",
    "timeout": "seconds before the whole role is stopped (a step timeout)",
    "heartbeat_timeout": "agent --heartbeat-timeout in seconds",
    "hang_timeout": "agent --hang-timeout in seconds (no output, heartbeat or progress of any rank: stacks, then fail)",
    "grace_period": "agent --grace-period in seconds (SIGTERM to SIGKILL)",
    "secret_env": "{ENV_NAME: 'secret-name/key'}: environment from a Kubernetes Secret",
    "retry_delay": "seconds between orchestrator retries (APPLICATION policy)",
    "retry_backoff": "multiplier of retry_delay per retry (APPLICATION policy)",
    "max_retry_delay": "cap of the retry delay in seconds (APPLICATION policy)",
}
#: Keys accepted in ``app.metadata`` with the ``torchstep.`` prefix.
APP_OPTIONS: dict[str, str] = {"torchstep.timeout": "seconds before the whole step is stopped"}


class RetryOwner(str, enum.Enum):
    """Who spends a role's ``max_retries`` (exactly one layer, never two).

    >>> RetryOwner.AGENT.value
    'agent'
    """

    ORCHESTRATOR = "orchestrator"  # Airflow retries / KFP set_retry / Prefect retries
    AGENT = "agent"  # the embedded agent's --max-restarts (+ lost-replica replacement)
    ROLE = "role"  # the local supervisor / the Job of the role restarts every replica of it
    NONE = "none"  # max_retries == 0


@dataclass(frozen=True)
class RetryBudget:
    """A role's retry budget: its policy, the one layer that owns it and the count.

    >>> b = RetryBudget("REPLICA", RetryOwner.AGENT, 3)
    >>> (b.agent_restarts, b.orchestrator_retries, b.role_retries)
    (3, 0, 0)

    Args:
        policy: the TorchX retry policy's name (``APPLICATION``, ``REPLICA``, ``HOT_SPARE``,
            ``ROLE``).
        owner: the one layer that spends the budget (:class:`RetryOwner`).
        count: the role's ``max_retries`` (0 means nobody retries).
    """

    policy: str
    owner: RetryOwner
    count: int

    @property
    def agent_restarts(self) -> int:
        """``--max-restarts`` for this role's agents."""
        return self.count if self.owner is RetryOwner.AGENT else 0

    @property
    def orchestrator_retries(self) -> int:
        """Retries of the whole step by the orchestrator (Airflow/Prefect ``retries``, KFP ``set_retry``)."""
        return self.count if self.owner is RetryOwner.ORCHESTRATOR else 0

    @property
    def role_retries(self) -> int:
        """Restarts of every replica of the role by the local supervisor / its Job (``ROLE``, TorchX nightly)."""
        return self.count if self.owner is RetryOwner.ROLE else 0


#: The retry budget table of docs/translation.md (policy → owner). HOT_SPARE keeps spare
#: replicas in the elastic range, so its failures are the agent's like REPLICA.
RETRY_OWNERS: dict[str, RetryOwner] = {
    "APPLICATION": RetryOwner.ORCHESTRATOR,
    "REPLICA": RetryOwner.AGENT,
    "HOT_SPARE": RetryOwner.AGENT,
    "ROLE": RetryOwner.ROLE,
}


def policy_name(policy: Any) -> str | None:
    """The name of a retry policy given as a ``torchx.specs.RetryPolicy`` (any version,
    nightly's ``ROLE`` included) or as its name; ``None`` when it is not one of the table.

    >>> from torchx.specs import RetryPolicy
    >>> policy_name(RetryPolicy.REPLICA), policy_name("ROLE"), policy_name("replica")
    ('REPLICA', 'ROLE', None)

    Args:
        policy: a ``RetryPolicy`` member or its name (case-sensitive, as TorchX spells it).

    Returns:
        The policy's name, or ``None`` when it is none of ``APPLICATION``, ``REPLICA``,
        ``HOT_SPARE``, ``ROLE``.
    """
    name = policy.name if isinstance(policy, enum.Enum) else policy
    return name if isinstance(name, str) and name in RETRY_OWNERS else None


def retry_budget(policy: Any, max_retries: int) -> RetryBudget:
    """The single implementation of the retry budget table: ``policy`` (a RetryPolicy or
    its name) and ``max_retries`` → the one owner of the budget.

    >>> retry_budget("REPLICA", 3).agent_restarts
    3
    >>> retry_budget("APPLICATION", 2).orchestrator_retries
    2
    >>> retry_budget("REPLICA", 0).owner.value
    'none'

    Args:
        policy: the role's ``retry_policy`` (a ``RetryPolicy`` member or its name).
        max_retries: the role's ``max_retries``, an integer in ``0..MAX_RETRIES``.

    Returns:
        The budget with its owner (:attr:`RetryOwner.NONE` when ``max_retries`` is 0).

    Raises:
        SpecError: an unknown policy, or a count that is not an integer in range.
    """
    name = policy_name(policy)
    if name is None:
        raise SpecError(
            "retry_policy", None, f"unknown retry policy {policy!r}", fix=f"use one of: {', '.join(RETRY_OWNERS)}"
        )
    if not isinstance(max_retries, int) or isinstance(max_retries, bool) or not 0 <= max_retries <= MAX_RETRIES:
        raise SpecError("max_retries", None, f"must be an integer in 0..{MAX_RETRIES}", fix="e.g. 2")
    owner = RETRY_OWNERS[name] if max_retries > 0 else RetryOwner.NONE
    return RetryBudget(policy=name, owner=owner, count=max_retries)


@dataclass(frozen=True)
class StepRetry:
    """Retries of the whole step that the orchestrator owns (APPLICATION policy), with the
    timing from ``role.metadata["torchstep"]`` (``retry_delay``, ``retry_backoff``,
    ``max_retry_delay``; ``None`` = the orchestrator's default). Every adapter maps this
    one object (Airflow ``retries``/``retry_delay``, KFP ``set_retry``, Prefect ``retries``).

    >>> StepRetry(2, delay_s=10.0, backoff=2.0, max_delay_s=15.0).delays()
    [10.0, 15.0]

    Args:
        count: how many times the orchestrator runs the step again after a failure.
        delay_s: seconds before the first retry (``retry_delay``); ``None``: the
            orchestrator's default.
        backoff: multiplier of the delay per retry (``retry_backoff``); ``None``: 1.
        max_delay_s: cap of any one delay in seconds (``max_retry_delay``); ``None``: no cap.
        role_index: the role whose budget it is (for field paths in errors).
    """

    count: int
    delay_s: float | None = None
    backoff: float | None = None
    max_delay_s: float | None = None
    role_index: int | None = None

    def delays(self, default_delay_s: float = 0.0) -> list[float]:
        """The wait before each retry (``delay * backoff**i``, capped at ``max_delay_s``):
        the one rule every target follows (``torchstep run``, Airflow, KFP, Prefect).

        Args:
            default_delay_s: seconds that stand in for an unset ``retry_delay`` (the
                orchestrator's own default).

        Returns:
            One delay in seconds per retry, ``count`` of them.
        """
        base = self.delay_s if self.delay_s is not None else default_delay_s
        out = [base * (self.backoff or 1.0) ** i for i in range(self.count)]
        return [min(d, self.max_delay_s) for d in out] if self.max_delay_s is not None else out


@dataclass(frozen=True)
class Resources:
    """Per-replica resources; ``None`` means unset (TorchX's NULL_RESOURCE uses -1).

    ``devices`` are Kubernetes extended resources (``{"vpc.amazonaws.com/efa": 4}``),
    ``capabilities`` node labels (``{"node.kubernetes.io/instance-type": "p4d.24xlarge"}``).

    >>> Resources(cpu=2, mem_mb=4096).gpu
    0

    Args:
        cpu: CPU cores per replica (fractions allowed); ``None``: unset.
        gpu: GPUs per replica (``nvidia.com/gpu``); 0: none.
        mem_mb: memory per replica in MiB (TorchX's ``memMB``); ``None``: unset.
        devices: Kubernetes extended resources and their counts.
        capabilities: node labels the replica must be scheduled on.
    """

    cpu: float | None = None
    gpu: int = 0
    mem_mb: int | None = None
    devices: Mapping[str, int] = field(default_factory=dict)
    capabilities: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mount:
    """A mount of every replica of a role (TorchX's ``BindMount``, ``VolumeMount``,
    ``DeviceMount``).

    >>> Mount("volume", "datasets", "/data", read_only=True).kind
    'volume'

    Args:
        kind: ``bind`` (host path), ``volume`` (PVC claim) or ``device``.
        src: the host path, the PVC's claim name or the host device path.
        dst: the path inside the container.
        read_only: mount it read-only.
        permissions: devices only: cgroup permissions such as ``"rwm"``.
    """

    kind: str
    src: str
    dst: str
    read_only: bool = False
    permissions: str | None = None  # devices only ("rwm")


#: port_map names that mean "the rendezvous port" (TorchX's dist.ddp uses ``c10d``).
RDZV_PORT_NAMES = frozenset({"c10d", "rdzv", "rendezvous", "master"})


@dataclass(frozen=True)
class Port:
    """A named port of every replica (``Role.port_map``). ``rendezvous``: the port names
    the rendezvous (:data:`RDZV_PORT_NAMES`), which the launchers replace with their own;
    ``env``: the variable that carries the port on the local target (``TORCHSTEP_PORT_TB``).

    >>> Port("tb", 6006).port
    6006

    Args:
        name: the ``port_map`` key (``tb``, ``c10d``).
        port: the port number.
        rendezvous: whether the name is a rendezvous port name.
        env: the variable that carries the port on the local target; ``None``: none.
    """

    name: str
    port: int
    rendezvous: bool = False
    env: str | None = None


@dataclass(frozen=True)
class SecretRef:
    """An environment variable read from a Kubernetes Secret, never copied by value
    (``role.metadata["torchstep"]["secret_env"] = {"HF_TOKEN": "hf-token/token"}``).

    >>> SecretRef("HF_TOKEN", "hf-token", "token").secret
    'hf-token'

    Args:
        env: the environment variable the workers read.
        secret: the Kubernetes Secret's name (in the step's namespace).
        key: the key inside the Secret.
    """

    env: str
    secret: str
    key: str


@dataclass(frozen=True)
class Decision:
    """One row of the translation table: a field, its value and what it becomes.

    ``action`` is ``honoured``, ``warning`` (honoured, but the step will most likely fail
    where it runs: ``becomes`` says why, ``fix`` what to do), ``ignored`` (with the reason in
    ``becomes``) or ``rejected`` (only seen by :func:`torchstep.explain`; ``build_plan``
    raises).

    >>> Decision("roles[0].resource.memMB", "1024", "ignored", "advisory on the local target").action
    'ignored'

    Args:
        field: the AppDef field's path (``roles[0].resource.memMB``).
        value: its value as text.
        action: ``honoured``, ``warning``, ``ignored`` or ``rejected``.
        becomes: what it maps to on the target, or why it is ignored or fails.
        fix: what to change (warnings and rejections); ``None``: nothing to do.
    """

    field: str
    value: str
    action: str
    becomes: str
    fix: str | None = None


@dataclass(frozen=True)
class RolePlan:
    """One role, normalised for a target.

    ``args`` and ``env`` are the AppDef's, byte for byte (macros unbound: see :meth:`bind`).
    ``min_replicas``/``num_replicas`` are the elastic range, ``nproc_per_node`` the worker
    processes per replica, ``retry`` the role's one retry budget, ``*_s`` seconds or
    ``None`` (unset), ``macros`` the TorchX macros the role uses.

    >>> import torchstep
    >>> r = torchstep.build_plan(torchstep.materialize("utils.echo", ["--msg", "hi ${app_id}"]), "local").roles[0]
    >>> r.argv, sorted(r.macros), r.nnodes
    (['echo', 'hi ${app_id}'], [<Macro.APP_ID: 'app_id'>], '1')

    Args:
        name: the role's name in the AppDef.
        k8s_name: its DNS-1123 form, used in object names and labels.
        image: the container image (or, on the local target, a directory).
        entrypoint: the command the role runs (``python``, ``torchrun``...).
        args: the command's arguments, macros unbound.
        env: the role's environment, macros unbound.
        secret_env: variables read from Kubernetes Secrets, never by value.
        min_replicas: the fewest replicas the role runs with (elastic lower bound).
        num_replicas: the replicas the role asks for (elastic upper bound).
        nproc_per_node: worker processes per replica.
        uses_torchrun: whether the entrypoint is ``torchrun`` (the agent replaces it).
        resources: per-replica resources.
        mounts: mounts of every replica.
        ports: named ports of every replica.
        retry: the role's retry budget and its one owner.
        timeout_s: seconds before the role is stopped; ``None``: no timeout.
        heartbeat_timeout_s: the agent's ``--heartbeat-timeout`` in seconds; ``None``: its default.
        grace_period_s: seconds from SIGTERM to SIGKILL; ``None``: the agent's default.
        hang_timeout_s: the agent's ``--hang-timeout`` in seconds; ``None``: off.
        retry_delay_s: seconds before an orchestrator retry; ``None``: the orchestrator's default.
        retry_backoff: multiplier of the retry delay per retry; ``None``: 1.
        max_retry_delay_s: cap of a retry delay in seconds; ``None``: no cap.
        macros: the TorchX macros the role's args and env use.
        metadata: the role's ``metadata`` (``kubernetes``, ``torchstep`` keys...).
        workdir: local target: the image when it is a directory; ``None`` otherwise.
        index: the role's position in ``AppDef.roles`` (for field paths in errors).
    """

    name: str
    k8s_name: str
    image: str
    entrypoint: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    secret_env: tuple[SecretRef, ...]
    min_replicas: int
    num_replicas: int
    nproc_per_node: int
    uses_torchrun: bool
    resources: Resources
    mounts: tuple[Mount, ...]
    ports: tuple[Port, ...]
    retry: RetryBudget
    timeout_s: float | None
    heartbeat_timeout_s: float | None
    grace_period_s: float | None
    retry_delay_s: float | None
    retry_backoff: float | None
    max_retry_delay_s: float | None
    macros: frozenset[Macro]
    metadata: Mapping[str, Any]
    workdir: str | None = None  # local target: the image when it is a directory
    index: int = 0  # position in AppDef.roles (for field paths in errors raised at run time)
    hang_timeout_s: float | None = None

    @property
    def argv(self) -> list[str]:
        """The role's command as an argv list (macros not yet bound)."""
        return [self.entrypoint, *self.args]

    @property
    def elastic(self) -> bool:
        """True when the role may run with fewer replicas (``min_replicas < num_replicas``)."""
        return self.min_replicas != self.num_replicas

    @property
    def nnodes(self) -> str:
        """torchrun's ``--nnodes`` value: ``N`` or ``MIN:MAX``."""
        return str(self.num_replicas) if not self.elastic else f"{self.min_replicas}:{self.num_replicas}"

    def bind(self, values: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """argv and env with macros bound as TorchX's ``macros.Values.apply`` binds them:
        every arg and every env value (not the entrypoint); ``$$`` becomes ``$``.

        Args:
            values: macro name → value (``app_id``, ``replica_id``, ``rank0_env``...).

        Returns:
            The argv list (entrypoint first) and the environment, both bound.
        """
        return (
            [self.entrypoint, *(substitute(a, values) for a in self.args)],
            {k: substitute(v, values) for k, v in self.env.items()},
        )

    def bound_metadata(self, values: Mapping[str, str]) -> dict[str, Any]:
        """A copy of the role's metadata with macros bound in every nested string, as
        TorchX binds them (e.g. a ``${app_id}`` label in ``metadata["kubernetes"]``).

        Args:
            values: macro name → value.

        Returns:
            A new dict; the plan's metadata is not changed.
        """
        return substitute_nested(dict(self.metadata), values)

    def secret_values(self, environ: Mapping[str, str]) -> dict[str, str]:
        """Local target: the secret environment read from ``environ`` (the launching
        process's environment) at launch. Planning never reads the environment, so a
        plan built where the secret is absent (a DAG parser) stays valid.

        Args:
            environ: the environment to read from (usually ``os.environ``).

        Returns:
            Variable name → secret value, one per :attr:`secret_env` entry.

        Raises:
            SpecError: a variable is not set (the first missing one is named).
        """
        missing = [r for r in self.secret_env if r.env not in environ]
        if missing:
            r = missing[0]
            raise SpecError(
                f"roles[{self.index}].metadata['torchstep']['secret_env'][{r.env!r}]",
                "local",
                f"the local target reads secret {r.secret}/{r.key} from the environment variable {r.env}, "
                "which is not set",
                fix=f"export {r.env} before running, or run on Kubernetes",
            )
        return {r.env: environ[r.env] for r in self.secret_env}


@dataclass(frozen=True)
class StepPlan:
    """The whole AppDef normalised for one target.

    ``k8s_name`` is the DNS-1123 prefix of every object name (the run-unique suffix is
    added at run time, :func:`torchstep.plan.names.run_name`); ``timeout_s`` the step timeout
    (``app.metadata["torchstep.timeout"]``); ``decisions`` one row per field (what
    :func:`torchstep.explain` prints).

    >>> import torchstep
    >>> plan = torchstep.build_plan(torchstep.materialize("utils.echo", []), "kubernetes")
    >>> plan.k8s_name, plan.roles[0].k8s_name, plan.retry_owner.value
    ('echo', 'echo', 'none')

    Args:
        app_name: the AppDef's name.
        k8s_name: the DNS-1123 prefix of every object name.
        target: ``local``, ``kubernetes`` or ``kfp``.
        roles: one plan per role, in the AppDef's order.
        timeout_s: the step timeout in seconds; ``None``: none.
        decisions: one row per field, what became of it on the target.
        metadata: the AppDef's ``metadata``.
    """

    app_name: str
    k8s_name: str
    target: str
    roles: tuple[RolePlan, ...]
    timeout_s: float | None
    decisions: tuple[Decision, ...]
    metadata: Mapping[str, str]

    @property
    def notes(self) -> tuple[Decision, ...]:
        """Fields ignored on this target, with the reason."""
        return tuple(d for d in self.decisions if d.action == "ignored")

    @property
    def warnings(self) -> tuple[Decision, ...]:
        """Fields honoured as given that will most likely fail on the target (an image known
        to lack torchstep, a local path as a container image), each with its fix."""
        return tuple(d for d in self.decisions if d.action == "warning")

    @property
    def orchestrator_retries(self) -> int:
        """Retries of the whole step that the orchestrator owns (APPLICATION policy)."""
        return max((r.retry.orchestrator_retries for r in self.roles), default=0)

    @property
    def step_retry(self) -> StepRetry:
        """The orchestrator's retries of this step and their timing (:func:`step_retry_of`)."""
        return step_retry_of(self.roles)

    @property
    def retry_owner(self) -> RetryOwner:
        """The retry owner of the step (the first role's that has one; the planner
        rejects an orchestrator-owned budget mixed with any other)."""
        return next((r.retry.owner for r in self.roles if r.retry.owner is not RetryOwner.NONE), RetryOwner.NONE)

    def role(self, name: str) -> RolePlan:
        """The plan of the role called ``name``.

        Args:
            name: the role's name in the AppDef.

        Returns:
            The role's plan.

        Raises:
            KeyError: no role has that name.
        """
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


def step_retry_of(roles: tuple[RolePlan, ...] | list[RolePlan]) -> StepRetry:
    """The retries of the whole step and their timing: those of the role that owns the
    most orchestrator retries (the first one on a tie); its delays apply to the step.

    >>> step_retry_of([]).count
    0

    Args:
        roles: the plan's roles.

    Returns:
        The step's retries (``StepRetry(0)`` when no role's budget is the orchestrator's).
    """
    count = max((r.retry.orchestrator_retries for r in roles), default=0)
    owner = next((r for r in roles if count and r.retry.orchestrator_retries == count), None)
    if owner is None:
        return StepRetry(0)
    return StepRetry(count, owner.retry_delay_s, owner.retry_backoff, owner.max_retry_delay_s, owner.index)
