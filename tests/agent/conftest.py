"""Fixtures of the agent tests (helpers live in agent_testlib.py)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_testlib import Agents, StoreHost  # noqa: E402


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Agents]:
    """Start agents; every one (and its workers) is killed at the end of the test."""
    a = Agents(tmp_path)
    try:
        yield a
    finally:
        a.cleanup()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[StoreHost]:
    """A separate process hosting the c10d store (what the local supervisor does)."""
    host = StoreHost(tmp_path)
    try:
        yield host
    finally:
        host.stop()
