"""The torch matrix's fixtures: ``row`` is a (Python, torch) of tools/torch_matrix.py, its
virtualenv built (or found in the user's cache) once per session.

Which rows: ``TORCHSTEP_TORCH_ROWS`` (``ends`` when unset: the oldest and the newest, what
``make test`` runs; ``make test-torch`` runs ``all``). A row whose interpreter is missing is
skipped with its reason, and fails under CI (``CI=true``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "agent"))  # agent_testlib: the agent suite's process helpers
sys.path.insert(0, str(HERE))


def _load_tool():
    if "torch_matrix" not in sys.modules:
        spec = importlib.util.spec_from_file_location("torch_matrix", ROOT / "tools" / "torch_matrix.py")
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules["torch_matrix"] = module  # before exec: its dataclasses look themselves up here
        spec.loader.exec_module(module)
    return sys.modules["torch_matrix"]


torch_matrix = _load_tool()

from matrixlib import MatrixAgents, RowPython  # noqa: E402


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "row" in metafunc.fixturenames:
        spec = os.environ.get("TORCHSTEP_TORCH_ROWS", "ends")
        rows = [] if spec == "none" else torch_matrix.select(spec)
        metafunc.parametrize("row", rows, ids=[r.id for r in rows], indirect=True)


_built: dict[str, RowPython | str] = {}


@pytest.fixture
def row(request: pytest.FixtureRequest) -> RowPython:
    """The row's interpreter (its virtualenv built on first use, under a lock shared by the
    xdist workers); a missing interpreter skips, or fails under CI."""
    r = request.param
    if r.id not in _built:
        try:
            _built[r.id] = RowPython(r, torch_matrix.ensure(r, log=lambda line: print(line, file=sys.stderr)), ROOT)
        except torch_matrix.RowSkipped as e:
            _built[r.id] = str(e)
    got = _built[r.id]
    if isinstance(got, str):
        if torch_matrix.in_ci():
            pytest.fail(f"{r.id}: {got} (CI=true: a row of the torch matrix must not be skipped)")
        pytest.skip(f"{r.id}: {got}")
    return got


@pytest.fixture
def agents(tmp_path: Path, row: RowPython) -> Iterator[MatrixAgents]:
    """Start the row's agents; every one (and its workers) is killed at the end of the test."""
    a = MatrixAgents(tmp_path, row)
    try:
        yield a
    finally:
        a.cleanup()
