"""docs/translation.md stays in step with the code: its example tables are what
``torchstep.explain`` prints today, and its rule tables name every field of every TorchX
spec class."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from torchx import specs

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "translation.md"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_translation_doc", ROOT / "tools" / "gen_translation_doc.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_generated_tables_match_the_code() -> None:
    gen = generator()
    current = DOC.read_text(encoding="utf-8")
    assert gen.regenerate(current) == current, (
        "docs/translation.md is out of date with torchstep.explain: run `python tools/gen_translation_doc.py` "
        "and commit the result"
    )
    for example in gen.EXAMPLES:
        for target in gen.TARGETS:
            assert f"on target '{target}'" in current and f"BEGIN GENERATED: {example.name}" in current


def test_check_mode_reports_a_stale_doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    gen = generator()
    stale = tmp_path / "translation.md"
    stale.write_text(DOC.read_text(encoding="utf-8").replace("| yes      |", "| no       |", 1), encoding="utf-8")
    monkeypatch.setattr(gen, "DOC", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "run `python tools/gen_translation_doc.py`" in capsys.readouterr().out
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0  # regenerated in place


@pytest.mark.parametrize(
    "cls", [specs.AppDef, specs.Role, specs.Resource, specs.BindMount, specs.VolumeMount, specs.DeviceMount]
)
def test_rule_tables_name_every_field(cls: type) -> None:
    rules = DOC.read_text(encoding="utf-8").split("## Examples")[0]
    missing = [f.name for f in dataclasses.fields(cls) if not any(p + f.name in rules for p in ("`", ".", "("))]
    assert not missing, f"docs/translation.md has no rule for {cls.__name__}.{missing}"
