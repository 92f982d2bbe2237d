"""The architecture checks itself: the import-linter contract of pyproject.toml holds and
no import cycle exists (both checks are shown to fail on a tree that breaks them); no module
imports another module's private name; no file refers to a document outside the repository."""

from __future__ import annotations

import ast
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
    bad.write_text(bad.read_text() + textwrap.dedent("\n\ndef _bad():\n    import torchstep.local.supervisor\n"))
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


# The project's own packages (the four distributions' import names).
PACKAGES = ("torchstep", "torchstep_airflow", "torchstep_kfp", "torchstep_prefect")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))  # __version__ is public


def private_imports(src: Path) -> list[str]:
    """Every import under ``src`` of a project module's ``_private`` name, or of a
    ``_private`` module from outside its own package. A private module may be imported by
    the modules of the package that holds it (``torchstep.agent._exec`` by
    ``torchstep.agent.settings``): that is what keeps it private to the package."""
    found = []
    for path in sorted(src.glob("*/src/*/**/*.py")):
        rel = path.relative_to(src)
        # the package a module is in (a package's __init__ is in the package itself)
        package = ".".join(path.relative_to(src / rel.parts[0] / "src").parent.parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            else:
                continue
            for module in modules:
                if module.split(".")[0] not in PACKAGES:
                    continue  # another project's private names are its business (torch's)
                parts = module.split(".")
                for i, part in enumerate(parts):
                    if _private(part) and package != ".".join(parts[:i]):
                        found.append(f"{rel}:{node.lineno}: module {module}")
                found += [f"{rel}:{node.lineno}: {module}.{n}" for n in names if _private(n)]
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports(ROOT / "adapters") == []


def test_the_private_import_check_sees_one(tmp_path: Path) -> None:
    pkg = tmp_path / "core" / "src" / "torchstep"
    (pkg / "agent").mkdir(parents=True)
    (pkg / "a.py").write_text("from torchstep.b import _helper, __version__\n")
    (pkg / "c.py").write_text("def f():\n    import torchstep.agent._exec\n")
    (pkg / "agent" / "d.py").write_text("from torchstep.agent._exec import run\n")  # its own package: fine
    (pkg / "e.py").write_text("from torch.distributed.run import _get_logs_specs_class\n")  # not ours
    assert private_imports(tmp_path) == [
        "core/src/torchstep/a.py:1: torchstep.b._helper",
        "core/src/torchstep/c.py:2: module torchstep.agent._exec",
    ]


def test_no_file_refers_to_a_document_outside_the_repository() -> None:
    outside = "ARCHITECTURE" + ".md"  # the design notes that were never part of the repository
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "adapters", "docs", "tests", "tools", "README.md"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    assert len(tracked) > 100
    citing = []
    for name in filter(None, tracked):
        path = ROOT / name
        if path.is_file() and outside in path.read_bytes().decode("utf-8", "replace"):
            citing.append(name)
    assert citing == []


def test_the_formatter_formats_every_python_file() -> None:
    """No ``# fmt: skip``: every tracked Python file is laid out by ruff (issue 34 item 7);
    a table that really needs its own layout would be the one exception, and none does."""
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    skipped = [
        f"{name}:{n}"
        for name in files.stdout.split()
        if (ROOT / name).is_file()
        for n, line in enumerate((ROOT / name).read_text(errors="replace").splitlines(), 1)
        if line.rstrip().endswith("# fmt: skip")
    ]
    assert not skipped, skipped
