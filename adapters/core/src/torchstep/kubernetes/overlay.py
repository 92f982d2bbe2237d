"""``role.metadata["kubernetes"]``: a partial pod merged into the rendered pod.

Two spellings are accepted: TorchX nightly's V1Pod overlay ``{"spec": {...}, "metadata":
{"labels": ..., "annotations": ...}}``, or a bare partial pod spec (``{"nodeSelector":
...}``) — a pod spec has no ``spec`` or ``metadata`` field, so the two cannot be confused.

Merge rules (TorchX nightly's, made strict): mappings merge key by key; lists append,
except lists whose items Kubernetes itself merges by key (containers, initContainers,
volumes and imagePullSecrets by ``name``, env by ``name``, volumeMounts by ``mountPath``,
ports by ``containerPort``), where an item with an existing key merges into that item.
The overlay *adds*: a value it sets that torchstep already rendered differently (the image,
``restartPolicy``, a nodeSelector key from a capability, a label torchstep owns, a volume or
env var of the same name, …) is a :class:`~torchstep.SpecError` naming the overlay field,
never a silent override.

Example::

    >>> spec = {"containers": [{"name": "main", "image": "img"}], "restartPolicy": "Never"}
    >>> meta = {"labels": {"torchstep/role": "trainer"}}
    >>> apply_overlay(meta, spec, {"tolerations": [{"key": "gpu", "operator": "Exists"}],
    ...     "containers": [{"name": "main", "volumeMounts": [{"name": "c", "mountPath": "/c"}]}]}, "roles[0]")
    >>> spec["containers"][0]["volumeMounts"], spec["tolerations"][0]["key"]
    ([{'name': 'c', 'mountPath': '/c'}], 'gpu')
    >>> apply_overlay(meta, spec, {"restartPolicy": "Always"}, "roles[0]")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: roles[0].metadata['kubernetes']['restartPolicy'] (target 'kubernetes'): ...
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torchstep.errors import SpecError

TARGET = "kubernetes"
#: List fields Kubernetes merges by a key (its strategic-merge patch keys). An overlay item
#: with an existing key merges into that item; only containers may gain new fields that way
#: (a probe, volumeMounts): a volume or env var gaining one would get a second source.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
}
_EXTENSIBLE_ITEMS = frozenset({"containers", "initContainers"})
_POD_KEYS = frozenset({"spec", "metadata"})
_METADATA_KEYS = frozenset({"labels", "annotations"})


def apply_overlay(metadata: dict[str, Any], spec: dict[str, Any], overlay: Mapping[str, Any], role_path: str) -> None:
    """Merge ``overlay`` into the pod's ``metadata`` and ``spec`` in place; ``role_path``
    (``roles[0]``) prefixes the field path of any SpecError.

    Args:
        metadata: the pod's ``metadata``, changed in place.
        spec: the pod's ``spec``, changed in place.
        overlay: the role's ``metadata["kubernetes"]`` overlay.
        role_path: the role's field path.

    Raises:
        SpecError: an overlay field that cannot be merged (wrong type, a field torchstep owns).
    """
    path = f"{role_path}.metadata['kubernetes']"
    if not isinstance(overlay, Mapping):
        raise SpecError(path, TARGET, "must be a partial pod spec (a mapping)", fix="{'nodeSelector': {...}}")
    spec_ov: Any = overlay
    meta_ov: Any = {}
    spec_path = path
    if overlay and set(overlay) <= _POD_KEYS:  # TorchX nightly: an overlay of the whole V1Pod
        spec_ov, meta_ov = overlay.get("spec", {}), overlay.get("metadata", {})
        spec_path = f"{path}['spec']"
        meta_path = f"{path}['metadata']"
        for value, where in ((spec_ov, spec_path), (meta_ov, meta_path)):
            if not isinstance(value, Mapping):
                raise SpecError(where, TARGET, "must be a mapping", fix="{'nodeSelector': {...}}")
        for key in meta_ov:
            if key not in _METADATA_KEYS:
                raise SpecError(
                    f"{meta_path}[{key!r}]",
                    TARGET,
                    "torchstep names the pods and their namespace",
                    fix="set only labels and annotations in the overlay's metadata",
                )
        _merge(metadata, meta_ov, meta_path)
    elif _POD_KEYS & set(overlay):
        key = sorted(_POD_KEYS & set(overlay))[0]
        raise SpecError(
            f"{path}[{key!r}]",
            TARGET,
            "mixes a V1Pod overlay (spec/metadata) with pod spec fields",
            fix="put every pod spec field under 'spec'",
        )
    _merge(spec, spec_ov, spec_path)


def _merge(base: dict[str, Any], over: Mapping[str, Any], path: str, *, add: bool = True) -> None:
    for key, value in over.items():
        here = f"{path}[{key!r}]"
        if not isinstance(key, str):
            raise SpecError(here, TARGET, "keys of a pod spec are strings", fix="e.g. 'nodeSelector'")
        if key not in base and not add:
            raise SpecError(
                here,
                TARGET,
                f"adds {key!r} to an item torchstep rendered under the same name",
                fix="give the overlay's item another name",
            )
        if key not in base:
            base[key] = copy.deepcopy(list(value) if isinstance(value, tuple) else value)
        elif isinstance(base[key], dict) and isinstance(value, Mapping):
            _merge(base[key], value, here, add=add)
        elif isinstance(base[key], list) and isinstance(value, list):
            _merge_list(base[key], value, key, here)
        elif base[key] != (list(value) if isinstance(value, tuple) else value):
            raise SpecError(
                here,
                TARGET,
                f"conflicts with the rendered value {base[key]!r} (from the AppDef or the run options)",
                fix="remove it from the overlay and change the AppDef field or run option it comes from",
            )


def _merge_list(base: list[Any], over: list[Any], field: str, path: str) -> None:
    merge_key = MERGE_KEYS.get(field)
    for i, item in enumerate(over):
        if merge_key is not None and isinstance(item, Mapping) and merge_key in item:
            match = next((b for b in base if isinstance(b, dict) and b.get(merge_key) == item[merge_key]), None)
            if match is not None:
                _merge(match, item, f"{path}[{i}]", add=field in _EXTENSIBLE_ITEMS)
                continue
        base.append(copy.deepcopy(item))
