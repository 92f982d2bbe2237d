"""Errors and reserved exit codes shared by the planner, the agent and every adapter.

Example::

    >>> from torchstep.errors import SpecError
    >>> err = SpecError("roles[0].mounts[1]", "kfp", "hostPath mounts do not exist in KFP",
    ...                 fix="use a VolumeMount (PVC) instead")
    >>> str(err)
    "roles[0].mounts[1] (target 'kfp'): hostPath mounts do not exist in KFP; fix: use a VolumeMount (PVC) instead"
"""

from __future__ import annotations

from torchstep.contract import AGENT_ERROR_EXIT_CODE, NON_RETRYABLE_EXIT_CODE

__all__ = ["AGENT_ERROR_EXIT_CODE", "NON_RETRYABLE_EXIT_CODE", "NonRetryableError", "SpecError"]


class SpecError(ValueError):
    """An AppDef field that cannot be honoured on a target.

    ``field`` is the path of the field (``roles[0].resource.gpu``), ``target`` the target
    (``local``, ``kubernetes``, ``kfp``) and the message says what to do instead.
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


class NonRetryableError(Exception):
    """Raise in a worker to fail the step without any retry (agent, launcher, orchestrator).

    Example::

        import torchstep

        @torchstep.record
        def main() -> None:
            if not dataset_exists():
                raise torchstep.NonRetryableError("dataset missing: retrying cannot help")
    """
