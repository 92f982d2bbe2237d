"""What a step publishes beside its result, as an orchestrator's adapter hands it on: the
rank-0 outputs (``torchstep.output(name, value)`` on global rank 0) as metrics, a model rank
0 saved (a path in the container or a URI), the result as data that holds no null, and the
files written where the orchestrator reads them (atomic, private, never through a symlink).

Example::

    >>> metrics_of({"metrics": {"loss": 0.5, "step": 3}, "tag": "x"})
    {'loss': 0.5, 'step': 3.0}
    >>> without_nulls({"a": None, "b": [1, None]}), is_uri("s3://bucket/model"), is_uri("/ckpt/model")
    ({'b': [1]}, True, False)
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["copy_out", "is_uri", "metrics_of", "unpublished", "without_nulls", "write_out"]

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def metrics_of(outputs: Mapping[str, Any]) -> dict[str, float]:
    """The step's metrics: the rank-0 output ``metrics`` (a mapping), else every rank-0
    output; their numbers only (a bool is not one).

    Args:
        outputs: the step result's rank-0 outputs.

    Returns:
        ``{name: value}`` as floats.
    """
    source = outputs.get("metrics")
    if not isinstance(source, Mapping):
        source = outputs
    return {str(k): float(v) for k, v in source.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def without_nulls(value: Any) -> Any:
    """``value`` (JSON data) without the keys whose value is null, nor nulls in lists: for an
    orchestrator whose parameters cannot hold null (KFP). A step result reads back the same
    with ``torchstep.StepResult.from_dict``.

    Args:
        value: JSON data.

    Returns:
        The same data without nulls.
    """
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value if v is not None]
    return value


def is_uri(text: str) -> bool:
    """Whether a published path is a URI (``scheme://...``: it stays where rank 0 put it).

    Args:
        text: the path rank 0 published.

    Returns:
        True for ``scheme://...``.
    """
    return bool(_URI.match(text))


def write_out(path: str, text: str) -> None:
    """Write ``text`` at a path the orchestrator gave (its output locations), its directory
    created: atomic, mode 0600, never through a symlink (:func:`torchstep.files.write_private`).

    Args:
        path: where the orchestrator reads it.
        text: the content.
    """
    from torchstep.files import write_private

    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    write_private(path, text)


def copy_out(source: str, dest: str) -> None:
    """Copy a file or directory a rank saved (a model) to where the orchestrator keeps it;
    symlinks are copied as links, never followed.

    Args:
        source: the file or directory rank 0 saved.
        dest: where the orchestrator keeps it.
    """
    os.makedirs(os.path.dirname(dest) or ".", mode=0o700, exist_ok=True)
    if os.path.isdir(source):
        shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
    else:
        shutil.copyfile(source, dest, follow_symlinks=False)


def unpublished(names: Iterable[str]) -> str:
    """The line that fails a step that succeeded without publishing the outputs ``names``.

    Args:
        names: the outputs the orchestrator expected and rank 0 did not publish.

    Returns:
        The line, with the fix.
    """
    said = ", ".join(repr(n) for n in names)
    return (
        f"torchstep: the step succeeded but rank 0 did not publish {said}: call torchstep.output(name, value) "
        "on global rank 0 (the model: a path in the container or a URI)"
    )
