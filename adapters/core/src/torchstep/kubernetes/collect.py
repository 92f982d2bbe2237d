"""The step result of a run on Kubernetes, from its pods: the latest pod of every replica
gives its agent's result summary (the container's termination message) or, without one,
its exit code; one :class:`~torchstep.result.StepResult` through
:func:`torchstep.result.merge`. The caller hands in only the run's own pods
(:mod:`torchstep.kubernetes.ownership`).

    >>> import torchstep
    >>> from torchx import specs
    >>> role = specs.Role("w", image="i", entrypoint="python", args=["-m", "w"], num_replicas=2)
    >>> rendered = torchstep.kubernetes.render_app(specs.AppDef("a", roles=[role]), cfg={"run_id": "r"})
    >>> collect(rendered, [], "SUCCEEDED", 0.0).state
    'SUCCEEDED'
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from torchstep.contract import SIGTERMED_EXIT_CODE
from torchstep.kubernetes.apiobj import age_order, get, termination
from torchstep.kubernetes.failure import FailureKind, classify_exit
from torchstep.kubernetes.preemption import Preemptions
from torchstep.kubernetes.render import LABEL_ROLE, RenderedApp
from torchstep.result import CANCELLED, FAILED, PREEMPTED, SUCCEEDED, ReplicaResult, StepResult, merge
from torchstep.untrusted import escape_controls

COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


def collect(
    rendered: RenderedApp, pods: Iterable[Any], state: str, started: float, preemptions: Preemptions | None = None
) -> StepResult:
    """The step result of ``rendered`` from ``pods`` (the run's own), the run being in
    ``state`` (the workloads' state, CANCELLED or PREEMPTED) since ``started`` (epoch seconds).

    A run that was preempted says so in ``warnings`` whatever its end; one that ends
    PREEMPTED (its budget spent) says so in ``message`` and is not retryable: a preemption
    never falls back on the step's own retries.

    Args:
        rendered: the rendering of the run.
        pods: the run's own pods (never another run's).
        state: the run's state.
        started: epoch seconds the run started.
        preemptions: what the watcher saw of the run's preemptions; ``None``: none.

    Returns:
        The merged step result, one replica result per replica of every role.
    """
    by_k8s = {r.role.k8s_name: r.role.name for r in rendered.roles}
    order = [r.role.name for r in rendered.roles]
    latest: dict[tuple[str, int], Any] = {}
    for pod in sorted(pods, key=age_order):
        labels = get(pod, "metadata", "labels") or {}
        idx = int((get(pod, "metadata", "annotations") or {}).get(COMPLETION_INDEX, 0))
        latest[(by_k8s.get(labels.get(LABEL_ROLE, ""), "?"), idx)] = pod
    per_replica = [
        replica_result(rendered.app_id, role, idx, pod, state)
        for (role, idx), pod in sorted(latest.items(), key=lambda kv: (_index(order, kv[0][0]), kv[0][1]))
    ]
    # merge applies the one rule (torchstep.result.is_retryable): a CANCELLED run is never retried
    merged = merge(rendered.app_id, per_replica, started_at=started, ended_at=time.time(), state=state)
    if state == CANCELLED and not merged.message:
        merged.message = "cancelled: every object of the run was deleted"
    if state == CANCELLED and merged.exit_code is None:  # its agents are SIGTERMed: as on the local target
        merged.exit_code = SIGTERMED_EXIT_CODE
    note = preemptions.note() if preemptions is not None else None
    if note is not None:
        merged.warnings.append(note)
    if state == PREEMPTED and preemptions is not None:
        merged.message = preemptions.exhausted_message()
        merged.retryable = False  # a spent budget never falls back on the step's retries
        merged.root_cause = None
        if merged.exit_code is None:
            merged.exit_code = SIGTERMED_EXIT_CODE
    return merged


def replica_result(app_id: str, role: str, idx: int, pod: Any, state: str) -> StepResult:
    """The result of replica ``idx`` of ``role`` from its latest ``pod``.

    Args:
        app_id: the run's id.
        role: the role's name.
        idx: the replica's index.
        pod: its latest pod (an API object or a dict).
        state: the run's state, for a replica whose agent left no result.

    Returns:
        The replica's result (from the agent's termination message when there is one).
    """
    code, message = termination(pod)
    disrupted = any(
        get(c, "type") == "DisruptionTarget" and get(c, "status") == "True"
        for c in get(pod, "status", "conditions") or []
    )
    kind = classify_exit(code, disrupted=disrupted)
    # the pod wrote this message: read so that nothing in it raises (issue 33); a field of the
    # wrong type is left out with a warning, and the container's own exit code stands in
    summary, refused = StepResult.read_summary(message)
    notes = [f"{role} replica {idx}: {n}" for n in (summary.warnings if summary is not None else refused)]
    if summary is not None and summary.state in (SUCCEEDED, FAILED, CANCELLED):
        exit_code = summary.exit_code if summary.exit_code is not None else code
        rep = ReplicaResult(role, idx, summary.state, exit_code, restarts=summary.restarts, message=summary.message)
        out = StepResult(
            app_id,
            summary.state,
            exit_code,
            summary.retryable,
            restarts=summary.restarts,
            root_cause=summary.root_cause,
            outputs=summary.outputs,
            warnings=notes,
        )
    else:
        rep_state = SUCCEEDED if kind is FailureKind.SUCCEEDED else (FAILED if code is not None else state)
        if kind is FailureKind.PREEMPTED:
            rep_state = PREEMPTED
        shown = None if summary is not None or refused else message
        rep = ReplicaResult(role, idx, rep_state, code, message=escape_controls(shown) if shown else None)
        out = StepResult(app_id, rep_state, code, warnings=notes)
    out.replicas = [rep]
    out.retryable = out.retryable and kind is not FailureKind.NON_RETRYABLE
    if rep.state == FAILED:
        detail = rep.message.strip().splitlines()[-1] if rep.message and rep.message.strip() else ""
        out.message = f"{role} replica {idx} exited {code} ({kind.value})" + (f": {detail}" if detail else "")
    else:
        out.message = None
    return out


def _index(names: list[str], name: str) -> int:
    return names.index(name) if name in names else len(names)
