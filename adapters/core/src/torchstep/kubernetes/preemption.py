"""Preemption is not failure: what the watcher (:class:`~torchstep.kubernetes.JobGang`) sees
when Kubernetes or Kueue takes a run's pods away, and the budget of its own that bounds it.

Kinds of ending and who handles them (docs/kubernetes.md, "Preemption"; docs/translation.md):

- a pod with the ``DisruptionTarget`` condition (drain, API eviction, scheduler preemption,
  a node gone): the Job's ``podFailurePolicy`` *ignores* it, so the Job controller replaces it
  without counting it against ``backoffLimit`` / ``backoffLimitPerIndex``; the new pod's agent
  resumes from the step's checkpoint (``torchstep.last_checkpoint()``);
- a Kueue eviction: Kueue suspends an admitted Job again (``spec.suspend: true``), the Job
  controller deletes its pods without counting them, and the Job waits in its queue until it
  is admitted again;
- either is one *preemption*. The run survives at most ``preemption_retries`` of them (the
  kubernetes run option, default :data:`~torchstep.kubernetes.options.DEFAULT_PREEMPTION_RETRIES`);
  one more ends the step ``PREEMPTED``, not retryable: the step's own retry budget (agent,
  Job or orchestrator) is never spent on a preemption.

A bare Pod (a 1-replica role rendered as a Pod) is replaced by nobody in Kubernetes: the
watcher itself creates it again under the same name once the preempted one is gone, from
this same budget (so no orchestrator retry is spent on it either).

Example::

    >>> said = []
    >>> p = Preemptions(budget=1, queue="team-a", say=said.append)
    >>> p.observe_job("train-w-1", {"spec": {"suspend": True}})
    >>> said[-1]
    'torchstep: Job train-w-1 queued (waiting for admission by Kueue, queue team-a)'
    >>> p.observe_job("train-w-1", {"spec": {"suspend": False}}); said[-1]
    'torchstep: Job train-w-1 admitted by Kueue (queue team-a): starting'
    >>> p.observe_job("train-w-1", {"spec": {"suspend": True}}); (p.count, p.exhausted)
    (1, False)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torchstep.kubernetes.apiobj import get
from torchstep.kubernetes.failure import DISRUPTION_CONDITION

__all__ = ["Preemptions", "disruption", "is_suspended"]


def disruption(pod: Any) -> tuple[str, str] | None:
    """The ``DisruptionTarget`` condition of ``pod`` as ``(reason, message)``, or ``None``
    when Kubernetes did not disrupt it.

    Args:
        pod: a pod (an API object or a dict).

    Returns:
        ``(reason, message)`` of the condition, or ``None``.

    >>> disruption({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
    ...     "reason": "PreemptionByScheduler", "message": "preempted"}]}})
    ('PreemptionByScheduler', 'preempted')
    """
    for c in get(pod, "status", "conditions") or []:
        if get(c, "type") == DISRUPTION_CONDITION and get(c, "status") == "True":
            return str(get(c, "reason") or "?"), str(get(c, "message") or "")
    return None


def is_suspended(job: Any) -> bool:
    """Whether ``job`` is suspended (``spec.suspend``: waiting for Kueue's admission, or
    evicted by it).

    Args:
        job: a Job (an API object or a dict).

    Returns:
        Whether the Job is suspended.
    """
    return bool(get(job, "spec", "suspend"))


class Preemptions:
    """One run's preemptions (see the module docstring): fed by the watcher's polls, it
    says each transition once in the step log (``say``) and counts them against ``budget``.

    Args:
        budget: the run option ``preemption_retries``.
        queue: the run option ``queue`` (named in the log), or ``None``.
        say: writes one line of torchstep's own into the step log.
    """

    def __init__(self, budget: int, queue: str | None, say: Callable[[str], None]) -> None:
        self.budget = budget
        self.queue = queue
        self.say = say
        #: Pods counted as preempted, by uid (a pod is counted once, however often it is read).
        self.pods: dict[str, str] = {}
        #: Kueue evictions: an admitted Job suspended again.
        self.evictions = 0
        self._jobs: dict[str, str] = {}  # Job name -> "queued" | "admitted"
        self._bare: str | None = None  # a bare Pod's preemption (it cannot be replaced)

    @property
    def count(self) -> int:
        """Preemptions so far: disrupted pods plus Kueue evictions."""
        return len(self.pods) + self.evictions

    @property
    def exhausted(self) -> bool:
        """Whether the run was preempted more often than its budget allows."""
        return self.count > self.budget

    @property
    def queued(self) -> bool:
        """Whether a Job of the run waits for Kueue's admission now."""
        return "queued" in self._jobs.values()

    @property
    def bare_pod(self) -> str | None:
        """The name of a preempted bare Pod the watcher must create again, or ``None``."""
        return self._bare

    def replaced(self) -> None:
        """The watcher created the preempted bare Pod again."""
        self._bare = None

    def observe_job(self, name: str, job: Any) -> None:
        """One read of Job ``name``: says queued, admitted (with any node selector Kueue
        injected) and evicted, each once per transition; an eviction counts.

        Args:
            name: the Job's name.
            job: the Job as read.
        """
        before = self._jobs.get(name)
        where = f" (waiting for admission by Kueue, queue {self.queue})" if self.queue else " (suspended)"
        if is_suspended(job):
            if before == "queued":
                return
            self._jobs[name] = "queued"
            if before == "admitted":
                self.evictions += 1
                self.say(
                    f"torchstep: Job {name} was evicted (suspended again, its pods deleted): "
                    f"{self._tally()}; queued again{where}"
                )
            else:
                self.say(f"torchstep: Job {name} queued{where}")
            return
        if before == "admitted":
            return
        self._jobs[name] = "admitted"
        if before == "queued":
            selector = get(job, "spec", "template", "spec", "node_selector")
            placed = f", nodeSelector {dict(selector)}" if selector else ""
            by = f"by Kueue (queue {self.queue})" if self.queue else "(resumed)"
            self.say(f"torchstep: Job {name} admitted {by}{placed}: starting")

    def observe_pods(self, pods: Iterable[Any], kinds: dict[str, str] | None = None) -> None:
        """One listing of the run's own pods: each newly disrupted pod counts once, unless
        its Job is suspended (then it went with that eviction, counted there).

        Args:
            pods: the run's own pods.
            kinds: pod name -> ``Pod`` for the run's bare Pods (which nothing replaces).
        """
        for pod in pods:
            uid = str(get(pod, "metadata", "uid") or get(pod, "metadata", "name"))
            found = disruption(pod)
            if found is None or uid in self.pods:
                continue
            owner = _job_of(pod)
            if owner is not None and self._jobs.get(owner) == "queued":
                continue
            name = str(get(pod, "metadata", "name"))
            reason, message = found
            self.pods[uid] = name
            bare = (kinds or {}).get(name) == "Pod"
            then = "torchstep creates it again" if bare else "the Job replaces it"
            then += ", resuming from the step's checkpoint"
            self.say(
                f"torchstep: pod {name} was preempted ({DISRUPTION_CONDITION}: {reason}"
                f"{': ' + message if message else ''}); {then}; {self._tally()}"
            )
            if bare:
                self._bare = name

    def _tally(self) -> str:
        return (
            f"preemption {self.count} of at most {self.budget} (preemption_retries); the step's retries are untouched"
        )

    def note(self) -> str | None:
        """The line the step's result keeps (in ``warnings``) when the run was preempted.

        Returns:
            The line, or ``None`` when nothing was preempted.
        """
        if not self.count:
            return None
        times = "time" if self.count == 1 else "times"
        return (
            f"preempted {self.count} {times} ({len(self.pods)} pod(s) with {DISRUPTION_CONDITION}, "
            f"{self.evictions} Kueue eviction(s)); preemption_retries={self.budget}; "
            "the step's retries are untouched"
        )

    def exhausted_message(self) -> str:
        """The message of a step that ends ``PREEMPTED`` because the budget is spent.

        Returns:
            The message, with the fix.
        """
        times = "time" if self.count == 1 else "times"
        return (
            f"preempted {self.count} {times}, more than preemption_retries={self.budget} allows "
            "(the step's own retries were not used); fix: raise preemption_retries, or run where "
            "the step is not preempted (a priority class, a queue with guaranteed quota)"
        )


def _job_of(pod: Any) -> str | None:
    for ref in get(pod, "metadata", "owner_references") or []:
        if get(ref, "kind") == "Job":
            return str(get(ref, "name"))
    return None
