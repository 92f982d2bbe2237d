"""The campaign's data: one planned run, what was observed, a violation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Run:
    """One run of the campaign: a surface, a fault class, a moment (line number) and a rank.

    ``key`` (``surface:fault:moment:rank``) is what ``--replay`` takes.
    """

    index: int
    surface: str
    fault: str
    moment: int
    rank: int

    @property
    def key(self) -> str:
        """``surface:fault:moment:rank``, the argument of ``--replay``."""
        return f"{self.surface}:{self.fault}:{self.moment}:{self.rank}"

    @classmethod
    def parse(cls, key: str, index: int = 0) -> Run:
        """The run ``key`` names (``surface:fault:moment[:rank]``, rank 1 when left out).

        Args:
            key: the replay key.
            index: the index to give the run.

        Returns:
            The run.

        Raises:
            ValueError: the key is malformed.
        """
        parts = key.split(":")
        if len(parts) not in (3, 4):
            raise ValueError(f"--replay wants surface:fault:moment[:rank], got {key!r}")
        return cls(index, parts[0], parts[1], int(parts[2]), int(parts[3]) if len(parts) == 4 else 1)


@dataclass
class Observation:
    """What a surface saw of one run, for the invariants.

    Attributes:
        rc: the watched process's exit status (negative: killed by that signal).
        duration_s: from start to exit.
        result: the step result (result.json, else the ``--json`` print), or None.
        result_source: where ``result`` came from.
        console: the watched process's stdout+stderr.
        run_dir: ``<log_dir>/<app_id>`` when known.
        leftovers: command lines of the run's processes alive 15 s after the end.
        hung: the harness killed the run at its deadline.
        injected: whether the external fault was really injected (the moment was reached).
        notes: free text for the report.
        expect_lines_in_files: rank logs must hold every line (False on a full log disk).
        state: the final state as the orchestrator reports it (None: the result's).
        watcher_killed: the process that printed the console was SIGKILLed (its tail is lost).
        agent_killed: an agent was SIGKILLed: what its tee had read but not yet copied to
            the console is lost with it (its workers' console lines may stop short).
        extra: what a surface keeps for its own ``check`` (the kubernetes fake's counters).
    """

    rc: int
    duration_s: float
    result: dict[str, Any] | None
    result_source: str
    console: str
    run_dir: Path | None
    leftovers: list[str] = field(default_factory=list)
    hung: bool = False
    injected: bool = True
    notes: list[str] = field(default_factory=list)
    expect_lines_in_files: bool = True
    state: str | None = None
    watcher_killed: bool = False
    agent_killed: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    """An invariant that did not hold in a run."""

    run: Run
    invariant: str
    detail: str
