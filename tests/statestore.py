"""A task state store as Airflow gives one (``context["task_state_store"]``), and as
torchstep's durable steps use any store: get/set of JSON values, every write recorded."""

from __future__ import annotations

from typing import Any


class TaskStateStore:
    """In memory; ``values`` holds the state, ``writes`` every ``set`` in order."""

    def __init__(self, values: dict[str, Any] | None = None) -> None:
        self.values: dict[str, Any] = dict(values or {})
        self.writes: list[tuple[str, Any]] = []

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def set(self, key: str, value: Any, *, retention: Any = None) -> None:
        self.values[key] = value
        self.writes.append((key, value))
