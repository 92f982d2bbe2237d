"""Retries on Kubernetes: a role's one retry budget and the agent's exit codes → Job
failure handling (``backoffLimit`` / ``backoffLimitPerIndex`` / ``podFailurePolicy``).

Every failure is handled by exactly one layer (docs/translation.md, "Retries: one budget,
one owner"). Inside a pod the agent restarts failed workers; a non-zero exit of the agent is its
final answer, so the Job controller only replaces a pod that was *lost* — evicted, preempted,
its node gone (the ``DisruptionTarget`` condition), or the agent itself killed or stopped —
and never a pod whose agent gave up.

Preemption is not failure: every Job's ``podFailurePolicy`` *ignores* a pod with the
``DisruptionTarget`` condition (the Job controller replaces it without counting it against
any budget); the watcher counts those against the run option ``preemption_retries``
instead (:mod:`torchstep.kubernetes.preemption`).

The agent's exit codes (the contract every target shares) and their :class:`FailureKind`:

- ``0``: every worker succeeded — ``succeeded``
- ``1``-``127``: a worker's own exit code, passed through once the budget is spent — ``failed``
- ``128+S``: a worker died of signal S, budget spent — ``failed``
- ``82``: non-retryable, a worker raised ``NonRetryableError`` — ``non-retryable``
- ``83``: the agent failed on its own account (rendezvous, watchdog) — ``agent-error``
- ``137``: the agent was SIGKILLed (container OOM-killed, ``kill -9``) — ``lost``
- ``143``: the agent was SIGTERMed (pod deleted: cancel, Kueue suspension, ``kubectl delete``) — ``stopped``
- any code with the pod condition ``DisruptionTarget`` (eviction, preemption, node gone) —
  ``preempted`` (ignored by the Job's ``podFailurePolicy``: never counted)

Example::

    >>> classify_exit(82), classify_exit(143, disrupted=True), classify_exit(1)
    (<FailureKind.NON_RETRYABLE: 'non-retryable'>, <FailureKind.PREEMPTED: 'preempted'>, <FailureKind.FAILED: 'failed'>)
"""

from __future__ import annotations

import enum
from typing import Any

from torchstep.contract import AGENT_ERROR_EXIT_CODE, NON_RETRYABLE_EXIT_CODE, SIGKILLED_EXIT_CODE, SIGTERMED_EXIT_CODE
from torchstep.plan.model import RetryOwner, RolePlan

#: Exit codes of an agent that did not give its own final answer: its pod is replaced
#: (REPLICA), counted against the index's ``backoffLimitPerIndex``.
REPLACED_EXIT_CODES = (AGENT_ERROR_EXIT_CODE, SIGKILLED_EXIT_CODE, SIGTERMED_EXIT_CODE)
#: The pod condition Kubernetes sets on a pod it disrupts (eviction, preemption, node
#: drain or shutdown, taint manager, pod GC of a lost node).
DISRUPTION_CONDITION = "DisruptionTarget"


class FailureKind(str, enum.Enum):
    """What a finished agent container means (see the table in the module docstring)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NON_RETRYABLE = "non-retryable"
    AGENT_ERROR = "agent-error"
    LOST = "lost"
    STOPPED = "stopped"
    #: Kubernetes disrupted the pod (``DisruptionTarget``): drain, preemption, a Kueue
    #: eviction, its node gone. Never the step's failure: replaced within ``preemption_retries``.
    PREEMPTED = "preempted"


def classify_exit(exit_code: int | None, *, disrupted: bool = False) -> FailureKind:
    """The meaning of the agent container's exit code. Adapters use it to tell their
    orchestrator not to retry (``NON_RETRYABLE``) — the same precedence as the rendered
    ``podFailurePolicy``.

    Args:
        exit_code: the agent container's exit code; ``None``: it never ran.
        disrupted: whether the pod has the ``DisruptionTarget`` condition (evicted, preempted).

    Returns:
        The kind of ending.

    >>> classify_exit(0), classify_exit(137), classify_exit(None)
    (<FailureKind.SUCCEEDED: 'succeeded'>, <FailureKind.LOST: 'lost'>, <FailureKind.LOST: 'lost'>)
    """
    if exit_code == NON_RETRYABLE_EXIT_CODE:
        return FailureKind.NON_RETRYABLE
    if disrupted:
        return FailureKind.PREEMPTED
    if exit_code is None or exit_code == SIGKILLED_EXIT_CODE:
        return FailureKind.LOST
    if exit_code == 0:
        return FailureKind.SUCCEEDED
    if exit_code == AGENT_ERROR_EXIT_CODE:
        return FailureKind.AGENT_ERROR
    if exit_code == SIGTERMED_EXIT_CODE:
        return FailureKind.STOPPED
    return FailureKind.FAILED


def needs_job(role: RolePlan) -> bool:
    """Whether the role's retry budget needs the Job controller: lost-pod replacement
    (REPLICA / HOT_SPARE) or role restarts (ROLE). A bare Pod can do neither.

    Args:
        role: the role's plan.

    Returns:
        Whether the role must render as a Job.

    >>> import torchstep
    >>> needs_job(torchstep.build_plan(torchstep.materialize("utils.echo", []), "kubernetes").roles[0])
    False
    """
    return role.retry.owner in (RetryOwner.AGENT, RetryOwner.ROLE)


def job_failure_fields(role: RolePlan, container: str) -> dict[str, Any]:
    """The JobSpec fields that carry the role's retry budget.

    - REPLICA / HOT_SPARE (agent owns ``max_retries`` = N): ``backoffLimitPerIndex: N``
      replaces a lost pod of an index at most N times; ``maxFailedIndexes: 0`` fails the
      Job as soon as one index is given up (its peers would wait in the rendezvous); the
      ``podFailurePolicy`` fails the Job at once on the agent's own final answer.
    - every policy: a pod with the ``DisruptionTarget`` condition (drain, preemption, a
      Kueue eviction, node gone) is ignored — replaced, never counted: preemptions have
      their own budget (the run option ``preemption_retries``), kept by the watcher.
    - ROLE (the Job owns N): ``backoffLimit: N * num_replicas`` — a role failure usually
      fails every replica (peers lose their collective), each counted.
    - APPLICATION (the orchestrator owns N) and no retries: ``backoffLimit: 0``.

    Every Job fails at once on exit code 82 with reason ``PodFailurePolicy`` (first rule:
    a non-retryable failure stops all layers, even during an eviction).

    Args:
        role: the role's plan.
        container: the agent's container name (a sidecar's exit code never matches a rule).

    Returns:
        JobSpec fields: ``backoffLimit`` and, as the budget needs, ``backoffLimitPerIndex``,
        ``maxFailedIndexes`` and ``podFailurePolicy``.

    >>> import torchstep
    >>> plan = torchstep.build_plan(torchstep.materialize("utils.echo", []), "kubernetes")
    >>> job_failure_fields(plan.roles[0], "main")["backoffLimit"]
    0
    """
    non_retryable = _on_exit("FailJob", container, "In", [NON_RETRYABLE_EXIT_CODE])
    # before the exit codes: a disrupted pod's agent was SIGTERMed (143) too, and its eviction,
    # not the 143, decides; Ignore needs restartPolicy Never (pod.py renders it)
    preempted = {"action": "Ignore", "onPodConditions": [{"type": DISRUPTION_CONDITION, "status": "True"}]}
    budget = role.retry
    if budget.owner is RetryOwner.AGENT:
        rules = [
            non_retryable,
            preempted,
            _on_exit("Count", container, "In", sorted(REPLACED_EXIT_CODES)),
            _on_exit("FailJob", container, "NotIn", [0]),
        ]
        return {
            "backoffLimitPerIndex": budget.count,
            "maxFailedIndexes": 0,
            "podFailurePolicy": {"rules": rules},
            "podReplacementPolicy": "Failed",
        }
    limit = budget.count * role.num_replicas if budget.owner is RetryOwner.ROLE else 0
    return {
        "backoffLimit": limit,
        "podFailurePolicy": {"rules": [non_retryable, preempted]},
        # a replacement starts only once the old pod is gone: never two pods with one hostname
        "podReplacementPolicy": "Failed",
    }


def _on_exit(action: str, container: str, operator: str, values: list[int]) -> dict[str, Any]:
    return {"action": action, "onExitCodes": {"containerName": container, "operator": operator, "values": values}}
