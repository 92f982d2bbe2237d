"""The identity of a try: run ids made from the orchestrator's identifiers, and :class:`Attempt`.

Glossary (docs/contributing.md): a *try* is one run of a step by its orchestrator (Airflow's
``try_number``, Prefect's ``run_count``, one pass of :func:`~torchstep.steps.run_tries`); a
*logical attempt* is every try of one task in one orchestrator run. Retries of a logical
attempt that keeps no try number of its own end in ``.try<n>`` (:func:`retry_run_id`).

Example::

    >>> step_run_id("train", "fit", "manual__2026-11-21T10:00:00+00:00", "try2")
    'train.fit.manual-2026-11-21t10-00-00-00-00.try2-f5e55d'
    >>> Attempt(("train", "fit", "manual__1"), try_number=2).run_id
    'train.fit.manual-1.try2-0834f0'
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from torchstep.errors import SpecError

__all__ = ["RUN_ID_MAX", "Attempt", "AttemptLike", "again", "as_attempt", "retry_run_id", "run_id_of", "step_run_id"]

#: The longest run id (DNS-1123 subdomains are at most 253 characters).
RUN_ID_MAX = 200
_INVALID = re.compile(r"[^a-z0-9]+")


def step_run_id(*parts: object) -> str:
    """The run id of one try of one step, from the orchestrator's identifiers.

    ``parts`` name the logical attempt, outermost first (Airflow dag, task, map index, run,
    try; KFP run, task; Prefect flow run, task call). Deterministic (the same parts give the
    same id), unique per try (the try is a part), and DNS-safe: lowercase ``[a-z0-9-]``
    words joined by ``.``; when that rewriting changed anything, a short hash of the exact
    parts is appended so two different identities never share an id.

    Args:
        parts: the identifiers; ``None`` and ``""`` are left out.

    Returns:
        The run id (at most :data:`RUN_ID_MAX` characters).

    Raises:
        ValueError: no part is left.

    >>> step_run_id("flow-run-1", "task-run-7")
    'flow-run-1.task-run-7'
    >>> step_run_id("Train", "fit") != step_run_id("train", "fit")
    True
    """
    raw = [str(p) for p in parts if p is not None and str(p) != ""]
    if not raw:
        raise ValueError("step_run_id needs at least one non-empty part")
    words = [_INVALID.sub("-", p.lower()).strip("-") or "x" for p in raw]
    text = ".".join(words)
    if words != raw or len(text) > RUN_ID_MAX:
        digest = hashlib.sha256("\x00".join(raw).encode("utf-8", "surrogatepass")).hexdigest()[:6]
        text = f"{text[: RUN_ID_MAX - 7].rstrip('.-')}-{digest}"
    return text


def retry_run_id(run_id: str, n: int) -> str:
    """The run id of try ``n`` of a logical attempt that keeps no try number itself: the
    one retry suffix, for :meth:`Attempt.again` and for the Kubernetes try that starts
    afresh past a kept failed Job.

    Args:
        run_id: the logical attempt's run id (its first try's).
        n: the try (1, 2, ...).

    Returns:
        ``run_id`` for try 1, else ``<run_id>.try<n>``.

    >>> retry_run_id("kfp.job-1.task-7", 1), retry_run_id("kfp.job-1.task-7", 2)
    ('kfp.job-1.task-7', 'kfp.job-1.task-7.try2')
    """
    return run_id if n == 1 else f"{run_id}.try{n}"


@dataclass(frozen=True)
class Attempt:
    """The orchestrator's identity of one logical attempt of a step, and of the try.

    ``parts`` name the logical attempt, outermost first (Airflow: dag, task, map index, DAG
    run; KFP: ``"kfp"``, pipeline job, task; Prefect: ``"prefect"``, flow run, task call).
    ``try_number`` is the orchestrator's try (1, 2, ...) when it keeps one, else ``None``:
    then the tries of a Kubernetes step are told apart on the cluster — a rerun after the
    watcher died attaches to the attempt's running (or finished) Jobs, a retry after a
    failure starts afresh (:class:`~torchstep.steps.kubernetes.KubernetesStep`).

    >>> Attempt(("kfp", "job-1", "task-7")).run_id
    'kfp.job-1.task-7'
    >>> Attempt(("kfp", "job-1", "task-7")).again(2).run_id
    'kfp.job-1.task-7.try2'

    Args:
        parts: what names the logical attempt, outermost first (each part as ``str``).
        try_number: the orchestrator's try (1, 2, ...); ``None`` when it keeps none.
    """

    parts: tuple[object, ...]
    try_number: int | None = None

    @property
    def logical_id(self) -> str:
        """The run id of the logical attempt (every try of it)."""
        return step_run_id(*self.parts)

    @property
    def run_id(self) -> str:
        """The run id of this try (:func:`step_run_id` of the parts and ``try<n>``)."""
        return step_run_id(*self._try_parts())

    def again(self, n: int) -> Attempt:
        """Try ``n`` of :func:`~torchstep.steps.run_tries` inside this one.

        Args:
            n: the try's number inside this attempt (>= 2; the first try is the attempt itself).

        Returns:
            The attempt whose run id ends in ``.try<n>`` (:func:`retry_run_id`); it keeps no
            try number, so a Kubernetes try of it is found on the cluster like any other.
        """
        return Attempt((*self._try_parts(), f"try{n}"))

    def _try_parts(self) -> tuple[object, ...]:
        return self.parts if self.try_number is None else (*self.parts, f"try{self.try_number}")


#: What an ``attempt`` argument may be: an :class:`Attempt`, the parts of one (a tuple), an
#: exact run id (a string), or ``None`` (no orchestrator identity: a fresh id per try).
AttemptLike = Attempt | tuple[object, ...] | str | None


def as_attempt(value: AttemptLike) -> Attempt | str | None:
    """An ``attempt`` argument as given (a tuple of parts becomes an :class:`Attempt`).

    Args:
        value: see :data:`AttemptLike`.

    Returns:
        The :class:`Attempt`, the run id string, or ``None``.

    Raises:
        SpecError: anything else (an empty string, a number...).
    """
    if isinstance(value, tuple):
        return Attempt(value)
    if value is None or isinstance(value, Attempt) or (isinstance(value, str) and value.strip()):
        return value
    raise SpecError(
        "attempt",
        None,
        f"{value!r} is not an attempt",
        fix="Attempt(parts, try_number), a tuple of identifiers, a run id string, or None",
    )


def again(value: Attempt | str | None, n: int) -> Attempt | str | None:
    """``value`` (an attempt or a run id) for try ``n`` of :func:`~torchstep.steps.run_tries`.

    Args:
        value: the first try's attempt or id; ``None`` stays ``None`` (a fresh id per try).
        n: the try (1, 2, ...).

    Returns:
        ``value`` for try 1; :meth:`Attempt.again`, or the id with the retry suffix.

    >>> again("nightly", 3)
    'nightly.try3'
    """
    if n == 1 or value is None:
        return value
    if isinstance(value, Attempt):
        return value.again(n)
    return retry_run_id(value, n)


def run_id_of(attempt: Attempt | str | None) -> str | None:
    """The run id of a try: an :class:`Attempt`'s, the string itself, or ``None``.

    Args:
        attempt: what :func:`as_attempt` returned.

    Returns:
        The run id, or ``None`` (a fresh random one is made at run time).
    """
    return attempt.run_id if isinstance(attempt, Attempt) else attempt
