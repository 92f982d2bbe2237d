"""Fixtures of the local-launcher tests: every test runs under a fresh environment token and
fails if any process carrying it is still alive at the end (helpers: local_testlib.py)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from local_testlib import TOKEN_ENV, describe, pids_with  # noqa: E402
from proclib import kill_all, wait_for  # noqa: E402


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Tag every process the test starts; none may survive the test."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_ENV, token)
    yield token
    try:  # a process may still be exiting (reaped by its parent) right now
        wait_for(lambda: not pids_with(token), 2, "the test's processes to exit")
    except AssertionError:
        left = pids_with(token)
        text = describe(left)
        kill_all(left)
        if left:
            pytest.fail(f"processes left behind:\n{text}")


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "logs"
