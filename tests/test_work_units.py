"""How `make unit` shares the suite among xdist workers (tests/conftest.py): a module is one
work unit but for SPREAD_MODULES, and the longest units are sent first."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# tests/conftest.py by its path: a bare "import conftest" may find another directory's
_spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
suite = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(suite)  # type: ignore[union-attr]


def test_every_spread_module_exists() -> None:
    """A module renamed or removed leaves no stale name: the list says what it spreads."""
    missing = sorted(m for m in suite.SPREAD_MODULES if not (ROOT / m).is_file())
    assert not missing, f"SPREAD_MODULES names modules that do not exist: {missing}"


def test_a_module_is_one_unit_but_a_spread_modules_tests_are_their_own() -> None:
    assert suite.work_unit("tests/airflow/test_deployment.py::test_a[x]") == "tests/airflow/test_deployment.py"
    spread = "tests/soak/test_soak_smoke.py::test_soak_smoke_holds_every_invariant[server-prefect]"
    assert suite.work_unit(spread) == spread


def test_the_make_target_schedules_by_these_units() -> None:
    """Without --dist loadscope the units are not used; without --no-loadscope-reorder xdist
    would reorder them by their number of tests instead of the longest first."""
    unit = next(line for line in (ROOT / "Makefile").read_text().splitlines() if "pytest -n" in line)
    assert "--dist loadscope" in unit and "--no-loadscope-reorder" in unit, unit
