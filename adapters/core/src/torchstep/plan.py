"""AppDef → StepPlan: the one place where AppDef semantics are decided.

``build_plan(app, target)`` validates and normalises every field of a TorchX AppDef for a
target (``local``, ``kubernetes``, ``kfp``). Each field is honoured, ignored with a note, or
rejected with a :class:`~torchstep.SpecError` naming the field path. Adapters only map the
plan's fields to native calls.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    >>> plan = torchstep.build_plan(app, target="kubernetes")
    >>> r = plan.roles[0]
    >>> (r.min_replicas, r.num_replicas, r.nproc_per_node, r.uses_torchrun)
    (2, 2, 2, True)
    >>> plan.roles[0].retry.owner.value
    'orchestrator'
"""

from __future__ import annotations

import enum
import os
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchstep.errors import SpecError
from torchstep.macros import Macro, substitute

TARGETS = ("local", "kubernetes", "kfp")

#: Keys accepted in ``role.metadata["torchstep"]`` (typos are errors, not silently dropped).
ROLE_OPTIONS: dict[str, str] = {
    "nproc_per_node": "worker processes per replica (default 1, or torchrun's --nproc-per-node)",
    "timeout": "seconds before the whole role is stopped (a step timeout)",
    "heartbeat_timeout": "agent --heartbeat-timeout in seconds",
    "grace_period": "agent --grace-period in seconds (SIGTERM to SIGKILL)",
    "secret_env": "{ENV_NAME: 'secret-name/key'}: environment from a Kubernetes Secret",
    "retry_delay": "seconds between orchestrator retries (APPLICATION policy)",
    "retry_backoff": "multiplier of retry_delay per retry (APPLICATION policy)",
    "max_retry_delay": "cap of the retry delay in seconds (APPLICATION policy)",
}
#: Keys accepted in ``app.metadata`` with the ``torchstep.`` prefix.
APP_OPTIONS: dict[str, str] = {"torchstep.timeout": "seconds before the whole step is stopped"}

#: Capability keys with a known meaning: Kubernetes node labels (→ nodeSelector).
KNOWN_CAPABILITIES = frozenset(
    {
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "kubernetes.io/arch",
        "kubernetes.io/os",
        "cloud.google.com/gke-accelerator",
        "cloud.google.com/gke-nodepool",
        "eks.amazonaws.com/nodegroup",
        "karpenter.sh/capacity-type",
        "nvidia.com/gpu.product",
    }
)

# Sanity limits: far above any real node, low enough to catch unit mistakes (MB vs bytes).
MAX_CPU = 4096
MAX_GPU = 256
MAX_MEM_MB = 64 * 1024 * 1024  # 64 TiB
MAX_REPLICAS = 100_000
MAX_RETRIES = 1000
MAX_NPROC = 4096


class RetryOwner(str, enum.Enum):
    """Who spends a role's ``max_retries`` (exactly one layer, never two)."""

    ORCHESTRATOR = "orchestrator"  # Airflow retries / KFP set_retry / Prefect retries
    AGENT = "agent"  # the embedded agent's --max-restarts (+ lost-replica replacement)
    ROLE = "role"  # the launcher / Job of the role restarts every replica of it
    NONE = "none"  # max_retries == 0


@dataclass(frozen=True)
class RetryBudget:
    """A role's retry budget: its policy, the one layer that owns it and the count."""

    policy: str
    owner: RetryOwner
    count: int

    @property
    def agent_restarts(self) -> int:
        """``--max-restarts`` for this role's agents."""
        return self.count if self.owner is RetryOwner.AGENT else 0

    @property
    def orchestrator_retries(self) -> int:
        return self.count if self.owner is RetryOwner.ORCHESTRATOR else 0

    @property
    def role_retries(self) -> int:
        return self.count if self.owner is RetryOwner.ROLE else 0


#: The retry budget table of ARCHITECTURE.md (policy → owner). HOT_SPARE keeps spare
#: replicas in the elastic range, so its failures are the agent's like REPLICA.
RETRY_OWNERS: dict[str, RetryOwner] = {
    "APPLICATION": RetryOwner.ORCHESTRATOR,
    "REPLICA": RetryOwner.AGENT,
    "HOT_SPARE": RetryOwner.AGENT,
    "ROLE": RetryOwner.ROLE,
}


def retry_budget(policy: str, max_retries: int) -> RetryBudget:
    """The single implementation of the retry budget table.

    >>> retry_budget("REPLICA", 3).agent_restarts
    3
    >>> retry_budget("APPLICATION", 2).agent_restarts
    0
    """
    owner = RETRY_OWNERS[policy] if max_retries > 0 else RetryOwner.NONE
    return RetryBudget(policy=policy, owner=owner, count=max_retries)


@dataclass(frozen=True)
class StepRetry:
    """Retries of the whole step that the orchestrator owns (APPLICATION policy), with the
    timing from ``role.metadata["torchstep"]`` (``retry_delay``, ``retry_backoff``,
    ``max_retry_delay``; ``None`` = the orchestrator's default). Every adapter maps this
    one object (Airflow ``retries``/``retry_delay``, KFP ``set_retry``, Prefect ``retries``).

    >>> StepRetry(2, delay_s=10.0, backoff=2.0, max_delay_s=15.0).delays()
    [10.0, 15.0]
    """

    count: int
    delay_s: float | None = None
    backoff: float | None = None
    max_delay_s: float | None = None

    def delays(self, default_delay_s: float = 0.0) -> list[float]:
        """The wait before each retry (``delay * backoff**i``, capped at ``max_delay_s``)."""
        base = self.delay_s if self.delay_s is not None else default_delay_s
        out = [base * (self.backoff or 1.0) ** i for i in range(self.count)]
        return [min(d, self.max_delay_s) for d in out] if self.max_delay_s is not None else out


@dataclass(frozen=True)
class Resources:
    """Per-replica resources; ``None`` means unset (TorchX's NULL_RESOURCE uses -1)."""

    cpu: float | None = None
    gpu: int = 0
    mem_mb: int | None = None
    devices: Mapping[str, int] = field(default_factory=dict)
    capabilities: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mount:
    """``kind`` is ``bind`` (host path), ``volume`` (PVC claim) or ``device``."""

    kind: str
    src: str
    dst: str
    read_only: bool = False
    permissions: str | None = None  # devices only ("rwm")


@dataclass(frozen=True)
class Port:
    name: str
    port: int


@dataclass(frozen=True)
class SecretRef:
    """An environment variable read from a Kubernetes Secret, never copied by value."""

    env: str
    secret: str
    key: str


@dataclass(frozen=True)
class Decision:
    """One row of the translation table: a field, its value and what it becomes.

    ``action`` is ``honoured``, ``ignored`` (with the reason in ``becomes``) or
    ``rejected`` (only seen by :func:`torchstep.explain`; ``build_plan`` raises).
    """

    field: str
    value: str
    action: str
    becomes: str
    fix: str | None = None


@dataclass(frozen=True)
class RolePlan:
    """One role, normalised for a target."""

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

    @property
    def argv(self) -> list[str]:
        """The role's command as an argv list (macros not yet bound)."""
        return [self.entrypoint, *self.args]

    @property
    def elastic(self) -> bool:
        return self.min_replicas != self.num_replicas

    @property
    def nnodes(self) -> str:
        """torchrun's ``--nnodes`` value: ``N`` or ``MIN:MAX``."""
        return str(self.num_replicas) if not self.elastic else f"{self.min_replicas}:{self.num_replicas}"

    def bind(self, values: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """argv and env with macros bound (TorchX semantics, see :mod:`torchstep.macros`)."""
        return (
            [self.entrypoint, *(substitute(a, values) for a in self.args)],
            {k: substitute(v, values) for k, v in self.env.items()},
        )


@dataclass(frozen=True)
class StepPlan:
    """The whole AppDef normalised for one target."""

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
    def orchestrator_retries(self) -> int:
        """Retries of the whole step that the orchestrator owns (APPLICATION policy)."""
        return max((r.retry.orchestrator_retries for r in self.roles), default=0)

    @property
    def step_retry(self) -> StepRetry:
        """The orchestrator's retries of this step and their timing: taken from the role that
        owns the most orchestrator retries (the first one on a tie)."""
        count = self.orchestrator_retries
        owner = next((r for r in self.roles if count and r.retry.orchestrator_retries == count), None)
        if owner is None:
            return StepRetry(0)
        return StepRetry(count, owner.retry_delay_s, owner.retry_backoff, owner.max_retry_delay_s)

    @property
    def retry_owner(self) -> RetryOwner:
        owners = {r.retry.owner for r in self.roles} - {RetryOwner.NONE}
        return owners.pop() if owners else RetryOwner.NONE

    def role(self, name: str) -> RolePlan:
        for r in self.roles:
            if r.name == name:
                return r
        raise KeyError(name)


def build_plan(app: Any, target: str) -> StepPlan:
    """Validate ``app`` (a ``torchx.specs.AppDef``) for ``target`` and normalise it.

    Raises :class:`~torchstep.SpecError` for the first field that cannot be honoured.
    """
    from torchstep.rules import Planner

    planner = Planner(app, target)
    plan = planner.run()
    for d in planner.decisions:
        if d.action == "rejected":
            raise SpecError(d.field, target, d.becomes, fix=d.fix)
    assert plan is not None
    return plan


def plan_decisions(app: Any, target: str) -> list[Decision]:
    """Every decision for every field, rejected ones included (used by ``explain``)."""
    from torchstep.rules import Planner

    planner = Planner(app, target)
    planner.run()
    return planner.decisions


_TORCHRUN_NAMES = ("torchrun", "torchstep-agent")


def detect_torchrun(entrypoint: str, args: list[str]) -> tuple[bool, int | None]:
    """Whether the role runs its own torchrun (TorchX ``dist.ddp`` style), and its
    ``--nproc-per-node`` when it is a plain number.

    >>> detect_torchrun("bash", ["-c", "torchrun --nnodes 1 --nproc_per_node 2 train.py"])
    (True, 2)
    >>> detect_torchrun("python", ["train.py"])
    (False, None)
    """
    words: list[str]
    if os.path.basename(entrypoint) in _TORCHRUN_NAMES:
        words = [entrypoint, *args]
    elif os.path.basename(entrypoint) in ("bash", "sh") and len(args) >= 2 and args[0] == "-c":
        try:
            words = shlex.split(args[1])
        except ValueError:
            return False, None
    elif os.path.basename(entrypoint).startswith("python") and args[:2] == ["-m", "torch.distributed.run"]:
        words = ["torchrun", *args[2:]]
    else:
        return False, None
    it: Iterator[str] = iter(words)
    found = False
    nproc: int | None = None
    for w in it:
        if os.path.basename(w) in _TORCHRUN_NAMES:
            found = True
        elif found and w in ("--nproc_per_node", "--nproc-per-node"):
            nproc = _int_or_none(next(it, ""))
        elif found and w.startswith(("--nproc_per_node=", "--nproc-per-node=")):
            nproc = _int_or_none(w.split("=", 1)[1])
    return found, nproc


def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) <= MAX_NPROC else None
