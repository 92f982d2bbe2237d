"""Errors and reserved exit codes shared by the planner, the agent and every adapter.

Two errors say why a step did not run: :class:`SpecError` is bad input (a field that
cannot be honoured, an option of the wrong type, a name already taken): fix the input,
retrying cannot help. :class:`RunError` is a run-time failure of the backend (the API server
refused or failed to create a Job, a pod ended without a result): the same step may run
when tried again, unless the error says otherwise (``retryable``).

Example::

    >>> from torchstep.errors import SpecError
    >>> err = SpecError("roles[0].mounts[1]", "kfp", "hostPath mounts do not exist in KFP",
    ...                 fix="use a VolumeMount (PVC) instead")
    >>> str(err)
    "roles[0].mounts[1] (target 'kfp'): hostPath mounts do not exist in KFP; fix: use a VolumeMount (PVC) instead"
"""

from __future__ import annotations

from typing import Any

from torchstep.contract import AGENT_ERROR_EXIT_CODE, NON_RETRYABLE_EXIT_CODE

__all__ = ["AGENT_ERROR_EXIT_CODE", "NON_RETRYABLE_EXIT_CODE", "NonRetryableError", "RunError", "SpecError"]


class SpecError(ValueError):
    """An AppDef field that cannot be honoured on a target.

    ``field`` is the path of the field (``roles[0].resource.gpu``), ``target`` the target
    (``local``, ``kubernetes``, ``kfp``) and the message says what to do instead.

    Args:
        field: the path of the offending field (``roles[0].resource.gpu``, ``cfg.namespace``).
        target: the target it cannot be honoured on; ``None`` when it is wrong everywhere.
        problem: what is wrong, in one sentence.
        fix: what to do instead; ``None``: the problem says it.
    """

    def __init__(self, field: str, target: str | None, problem: str, *, fix: str | None = None) -> None:
        self.field = field
        self.target = target
        self.problem = problem
        self.fix = fix
        where = f"{field} (target {target!r})" if target else field
        text = f"{where}: {problem}"
        if fix:
            text += f"; fix: {fix}"
        super().__init__(text)

    def __reduce__(self):  # keep pickling (multiprocessing, Airflow) working
        return (_rebuild_spec_error, (self.field, self.target, self.problem, self.fix))


def _rebuild_spec_error(field: str, target: str | None, problem: str, fix: str | None) -> SpecError:
    return SpecError(field, target, problem, fix=fix)


class RunError(RuntimeError):
    """A step could not be run: the backend refused, or failed to create or follow it (the
    API server would not create a Job, a pod ended without a step result). Not bad input
    (that is :class:`SpecError`): orchestrators retry the step unless ``retryable`` is
    ``False`` (someone must act first, e.g. delete the failed Jobs that are kept).

    Args:
        what: the object or step concerned, e.g. ``"Job ml/train-abc"``.
        reason: one line: what failed and the fix.
        retryable: whether running the step again can help.

    Example::

        >>> err = RunError("Pod ml/fit-1a2b", "the API server answered its creation without a uid; "
        ...                "fix: check the Kubernetes API server")
        >>> str(err)
        'Pod ml/fit-1a2b: the API server answered its creation without a uid; fix: check the Kubernetes API server'
        >>> err.retryable, isinstance(err, RuntimeError)
        (True, True)
    """

    def __init__(self, what: str, reason: str, *, retryable: bool = True) -> None:
        self.what = what
        self.reason = reason
        self.retryable = retryable
        super().__init__(f"{what}: {reason}")

    def __reduce__(self) -> tuple[Any, tuple[str, str, bool]]:  # pickling: multiprocessing, Airflow, Prefect
        return (_rebuild_run_error, (self.what, self.reason, self.retryable))


def _rebuild_run_error(what: str, reason: str, retryable: bool) -> RunError:
    return RunError(what, reason, retryable=retryable)


class NonRetryableError(Exception):
    """Raise in a worker to fail the step without any retry (agent, launcher, orchestrator).

    Example::

        import torchstep

        @torchstep.record
        def main() -> None:
            if not dataset_exists():
                raise torchstep.NonRetryableError("dataset missing: retrying cannot help")
    """
