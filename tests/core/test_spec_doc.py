"""The examples of docs/spec.md run and print what the page says."""

from __future__ import annotations

import doctest
from pathlib import Path

SPEC = Path(__file__).resolve().parents[2] / "docs" / "spec.md"


def test_spec_examples() -> None:
    result = doctest.testfile(
        str(SPEC),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        encoding="utf-8",
    )
    assert result.attempted >= 20 and result.failed == 0, (
        f"{result.failed} example(s) of {SPEC.name} failed (see above)"
    )
