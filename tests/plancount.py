"""Counting plans: every ``build_plan`` call a test's code makes, wherever it imports it from
(the planner module, or the ``torchstep`` package that re-exports it lazily)."""

from __future__ import annotations

from typing import Any

import pytest
import torchstep
import torchstep.plan.planner as planner


def count_plans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Patch ``build_plan`` to record ``(app name, target)`` of each call; returns the list."""
    calls: list[tuple[str, str]] = []
    real = planner.build_plan

    def counting(app: Any, target: str) -> Any:
        calls.append((getattr(app, "name", "?"), target))
        return real(app, target)

    monkeypatch.setattr(planner, "build_plan", counting)
    monkeypatch.setattr(torchstep, "build_plan", counting)
    return calls
