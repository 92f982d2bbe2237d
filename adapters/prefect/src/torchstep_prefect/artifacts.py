"""The Prefect artifacts of a step: what a distributed step did, in the Prefect UI.

- ``<task>-ranks``: a table, one row per rank — role, replica, rank, state, exit code,
  signal, restarts of its replica, log path;
- ``<task>-outputs``: a markdown table of the rank-0 outputs (metrics included) and the
  step's state, exit code and root cause.

Keys are the task run's name made into a Prefect artifact key
(:func:`torchstep.adapter.names.artifact_key`); each run of the task adds a new version under
the same key. :class:`ArtifactSink` is the Prefect sink of :func:`torchstep.adapter.publish`.

Everything a worker controls (output names and values, the root cause) goes into the
Markdown through :func:`torchstep.untrusted.escape_markdown`: shown as written, never a
link, an image, HTML or a broken table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from torchstep.adapter import Sink, escape_markdown, markdown_code, root_cause_line
from torchstep.adapter.names import artifact_key

if TYPE_CHECKING:
    from torchstep import StepResult


def rank_rows(result: StepResult) -> list[dict[str, Any]]:
    """One row per rank of ``result`` (the ``-ranks`` table)."""
    restarts: dict[tuple[str, int | None], int] = {(r.role, r.replica_id): r.restarts for r in result.replicas}
    rows = []
    for rk in sorted(result.ranks, key=lambda r: (r.role, r.rank)):
        rows.append(
            {
                "role": rk.role,
                "replica": rk.replica_id,
                "rank": rk.rank,
                "state": rk.state,
                "exit_code": rk.exit_code,
                "signal": rk.signal or "",
                "restarts": restarts.get((rk.role, rk.replica_id), 0),
                "where": f"waiting in {rk.waiting_in}"
                if rk.waiting_in
                else (rk.where or ""),  # when the agent stopped it
                "log": rk.log_file or "",
            }
        )
    return rows


def progress_percent(result: StepResult) -> float | None:
    """The step's last reported progress (``torchstep.progress``) in percent, or ``None``."""
    p = result.progress
    if not isinstance(p, dict):
        return None
    step, total = p.get("step"), p.get("total")
    if not isinstance(step, int | float) or not isinstance(total, int | float) or total <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * step / total))


def outputs_markdown(result: StepResult, outputs: Mapping[str, Any] | None = None) -> str:
    """The ``-outputs`` artifact: the step's outcome and its rank-0 outputs (``outputs``:
    as published, default the result's)."""
    outputs = result.outputs if outputs is None else outputs
    head = f"**{_cell(result.app_id)}**: {_cell(result.state)} (exit {result.exit_code}, restarts {result.restarts})"
    lines = [head, ""]
    if result.root_cause is not None:
        rc = result.root_cause
        lines += [f"Root cause: {markdown_code(rc.role)} rank {rc.rank}: {_cell(root_cause_line(rc))}", ""]
    elif result.message:  # stopped (a timeout, a cancel): what stopped it and where the ranks were
        lines += [_cell(result.message), ""]
    if outputs:
        lines += ["| output | value |", "|---|---|"]
        for key, value in sorted(outputs.items()):
            lines.append(f"| {markdown_code(str(key), max_chars=200)} | {_cell(json.dumps(value, default=str))} |")
    else:
        lines.append("No rank-0 outputs (`torchstep.output(name, value)` on global rank 0 publishes them).")
    return "\n".join(lines) + "\n"


class ArtifactSink(Sink):
    """The Prefect sink of :func:`torchstep.adapter.publish`: collects the rank-0 outputs,
    then creates both artifacts for the current task run (a warning in the run log, never a
    failed step, when the API refuses them).

    Args:
        task_name: the task run's name (the artifacts' key).
    """

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        self.outputs: dict[str, Any] = {}

    def output(self, name: str, value: Any) -> None:
        self.outputs[name] = value

    def result(self, result: StepResult) -> None:
        from prefect import get_run_logger
        from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact

        try:
            create_table_artifact(
                table=rank_rows(result),
                key=artifact_key(self.task_name, "ranks"),
                description=f"torchstep step {result.app_id}: every rank's outcome",
            )
            create_markdown_artifact(
                markdown=outputs_markdown(result, self.outputs),
                key=artifact_key(self.task_name, "outputs"),
                description=f"torchstep step {result.app_id}: rank-0 outputs",
            )
            percent = progress_percent(result)
            if percent is not None:  # the ranks called torchstep.progress(step, total)
                p = result.progress or {}
                create_progress_artifact(
                    progress=percent,
                    key=artifact_key(self.task_name, "progress"),
                    description=f"torchstep step {result.app_id}: step {p.get('step')} of {p.get('total')} "
                    "(the lowest rank's last torchstep.progress())",
                )
        except Exception as e:  # the step's outcome matters more than its artifacts
            get_run_logger().warning("torchstep: could not create the step's artifacts: %s", e)


def _cell(text: str) -> str:
    return escape_markdown(str(text), max_chars=500)
