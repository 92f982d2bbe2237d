"""The one line of a failure: what adapters log and raise with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchstep.result import root_cause_line
from torchstep.untrusted import MAX_TAIL_LINE_BYTES, cut, escape_controls

if TYPE_CHECKING:
    from torchstep.result import StepResult

__all__ = ["failure_summary"]


def failure_summary(result: StepResult) -> str:
    """One line: state, exit code and root cause of a failed step.

    The root cause is named by :func:`torchstep.result.root_cause_line`: the rank's last
    meaningful line (its exception, else its last log line), as everywhere.

    Args:
        result: the step's result.

    Returns:
        ``<app id> <state> (exit code N); <message or root cause>``.

    >>> from torchstep.result import StepResult
    >>> msg = "worker replica 1 exited 82 (non-retryable)"
    >>> failure_summary(StepResult("train-1", "FAILED", 82, message=msg))
    'train-1 FAILED (exit code 82); worker replica 1 exited 82 (non-retryable)'
    """
    text = f"{result.app_id} {result.state}"
    if result.exit_code is not None:
        text += f" (exit code {result.exit_code})"
    rc = result.root_cause
    if rc is not None:
        replica = rc.replica_id if rc.replica_id is not None else "?"
        text += f"; root cause: rank {rc.rank} ({rc.role} replica {replica}): {root_cause_line(rc)}"
    elif result.message:  # it may quote a worker or a pod: one line, shown, never obeyed
        text += f"; {cut(escape_controls(result.message, newlines=True), MAX_TAIL_LINE_BYTES)}"
    return text
