"""The architecture checks itself: the import-linter contract of pyproject.toml holds and
no import cycle exists; both checks are shown to fail on a tree that breaks them."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _load_cycles_tool():
    spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "tools" / "import_cycles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_contracts_hold() -> None:
    out = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout or "broken" not in out.stdout.lower()


def test_no_import_cycles() -> None:
    assert _load_cycles_tool().find_cycles() == []


def test_cycle_check_sees_a_cycle_through_a_package_init_and_a_function_import(tmp_path: Path) -> None:
    pkg = tmp_path / "cyclepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("def run():\n    from cyclepkg import worker\n    return worker\n")
    (pkg / "worker.py").write_text("import cyclepkg\n")
    sys.path.insert(0, str(tmp_path))
    try:
        cycles = _load_cycles_tool().find_cycles(("cyclepkg",))
    finally:
        sys.path.remove(str(tmp_path))
    assert cycles and set(cycles[0]) == {"cyclepkg", "cyclepkg.worker"}


def test_layer_contract_fails_when_the_plan_layer_imports_a_target(tmp_path: Path) -> None:
    # a copy of the tree where the plan layer imports the local target: lint-imports must say so
    src = tmp_path / "src"
    src.mkdir()
    subprocess.run(["cp", "-r", str(ROOT / "adapters" / "core" / "src" / "torchstep"), str(src)], check=True)
    bad = src / "torchstep" / "plan" / "limits.py"
    bad.write_text(bad.read_text() + textwrap.dedent("\n\ndef _bad():\n    import torchstep.local.launcher\n"))
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text((ROOT / "pyproject.toml").read_text())
    env = {
        **os.environ,
        "PYTHONPATH": f"{src}:{ROOT / 'adapters/airflow/src'}:{ROOT / 'adapters/kfp/src'}:{ROOT / 'adapters/prefect/src'}",
    }
    out = subprocess.run(
        [str(BIN / "lint-imports"), "--no-cache", "--config", str(cfg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode != 0
    assert "torchstep.plan is not allowed to import torchstep.local" in out.stdout
