"""Shared helpers of the core's own tests (only torchstep, torchx, pytest, hypothesis)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from torchstep.plan.model import Decision


def rows_missing(app: Any, decisions: Iterable[Decision]) -> set[str]:
    """Fields of ``app`` without a decision row — what would be dropped silently: every
    dataclass field of the AppDef, its roles and their resources, and every entry of the
    mappings and lists whose entries are translated one by one."""
    seen = {d.field for d in decisions}

    def has(path: str) -> bool:
        return any(f == path or f.startswith((path + ".", path + "[")) for f in seen)

    wanted = [f.name for f in dataclasses.fields(app)]
    wanted += [f"metadata[{k!r}]" for k in app.metadata]
    for i, role in enumerate(app.roles):
        p = f"roles[{i}]"
        wanted += [f"{p}.{f.name}" for f in dataclasses.fields(role)]
        wanted += [f"{p}.resource.{f.name}" for f in dataclasses.fields(role.resource)]
        wanted += [f"{p}.resource.devices[{k!r}]" for k in role.resource.devices]
        wanted += [f"{p}.resource.capabilities[{k!r}]" for k in role.resource.capabilities]
        wanted += [f"{p}.mounts[{j}]" for j in range(len(role.mounts))]
        wanted += [f"{p}.port_map[{k!r}]" for k in role.port_map]
        wanted += [f"{p}.metadata[{k!r}]" for k in role.metadata if k != "torchstep"]
        options = role.metadata.get("torchstep") or {}
        wanted += [f"{p}.metadata['torchstep'][{k!r}]" for k in options]
        wanted += [f"{p}.metadata['torchstep']['secret_env'][{k!r}]" for k in options.get("secret_env") or {}]
    return {w for w in wanted if not has(w)}


@pytest.fixture(scope="session")
def missing_rows() -> Callable[[Any, Iterable[Decision]], set[str]]:
    """:func:`rows_missing` (session-scoped: usable in hypothesis tests)."""
    return rows_missing
