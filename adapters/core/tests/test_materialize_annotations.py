"""Component modules written with ``from __future__ import annotations`` (string
annotations) materialise: TorchX alone fails on them with ``ValueError: Unknown``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torchstep

COMPONENT = textwrap.dedent(
    '''
    from __future__ import annotations
    from typing import List, Optional
    import torchx.specs as specs

    def trainer(lr: float = 0.1, steps: int = 10, tags: Optional[List[str]] = None) -> specs.AppDef:
        """Train.

        Args:
            lr: learning rate
            steps: number of steps
            tags: free tags
        """
        args = ["--lr", str(lr), "--steps", str(steps), *(tags or [])]
        return specs.AppDef(name="t", roles=[specs.Role(name="r", image="i", entrypoint="python", args=args)])
    '''
)


@pytest.fixture()
def component_file(tmp_path: Path) -> Path:
    path = tmp_path / "comp.py"
    path.write_text(COMPONENT)
    return path


def test_file_reference_with_string_annotations_parses_typed_args(component_file: Path) -> None:
    app = torchstep.materialize(f"{component_file}:trainer", ["--lr", "0.5", "--tags", "a,b"])
    assert app.roles[0].args == ["--lr", "0.5", "--steps", "10", "a", "b"]


def test_mapping_args_with_string_annotations(component_file: Path) -> None:
    app = torchstep.materialize(f"{component_file}:trainer", {"steps": "7"})
    assert app.roles[0].args == ["--lr", "0.1", "--steps", "7"]


def test_bad_value_for_a_string_annotated_parameter_is_a_spec_error(component_file: Path) -> None:
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.materialize(f"{component_file}:trainer", ["--steps", "many"])
    assert err.value.field == "component"
    assert "steps" in str(err.value)
