"""An AppDef as plain JSON data and back, for steps that carry a fixed AppDef into a
container (the KFP adapter's ``component_from_app``) instead of a component reference.

Every field of TorchX's ``AppDef``/``Role``/``Resource`` and the three mount kinds is kept,
and the extra fields of TorchX nightly (``Role.workspace``, ``Role.overrides``,
``Resource.tags``) are carried by name when the installed TorchX has them. A value that is
not JSON data (a metadata object, a callable) is a :class:`~torchstep.SpecError` naming the
field — never dropped.

    >>> from torchx import specs
    >>> app = specs.AppDef("a", roles=[specs.Role("w", image="img", entrypoint="echo", args=["{{x}}"],
    ...     mounts=[specs.VolumeMount(src="data", dst_path="/data")])])
    >>> back = app_from_dict(app_to_dict(app))
    >>> back == app
    True
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from torchstep.errors import SpecError

#: Bumped when the layout changes; a newer layout is refused with the fix.
APP_JSON_VERSION = 1
_MOUNT_KINDS = ("BindMount", "VolumeMount", "DeviceMount")


def app_to_dict(app: Any) -> dict[str, Any]:
    """``app`` (a ``torchx.specs.AppDef``) as JSON data (see the module docstring)."""
    out = {"version": APP_JSON_VERSION, **_fields(app, "app", skip=("roles",))}
    roles = []
    for i, role in enumerate(app.roles):
        path = f"roles[{i}]"
        data = _fields(role, path, skip=("resource", "mounts", "retry_policy"))
        data["retry_policy"] = role.retry_policy.name
        data["resource"] = _fields(role.resource, f"{path}.resource")
        data["mounts"] = [
            {"kind": type(m).__name__, **_fields(m, f"{path}.mounts[{j}]")} for j, m in enumerate(role.mounts)
        ]
        roles.append(data)
    out["roles"] = roles
    return out


def app_from_dict(data: Any) -> Any:
    """The ``torchx.specs.AppDef`` of :func:`app_to_dict`'s ``data``."""
    from torchx import specs

    if not isinstance(data, dict) or data.get("version") != APP_JSON_VERSION:
        raise SpecError("app", None, f"not an AppDef of layout {APP_JSON_VERSION}",
                        fix="build the step with the same torchstep version as the image runs")  # fmt: skip
    roles = []
    for r in data.get("roles", []):
        r = dict(r)
        resource = specs.Resource(**_known(specs.Resource, r.pop("resource", {})))
        mounts = [getattr(specs, m["kind"])(**_known(getattr(specs, m["kind"]), m)) for m in r.pop("mounts", [])
                  if m.get("kind") in _MOUNT_KINDS]  # fmt: skip
        policy = specs.RetryPolicy[r.pop("retry_policy")]
        roles.append(specs.Role(**_known(specs.Role, r), resource=resource, mounts=mounts, retry_policy=policy))
    return specs.AppDef(**_known(specs.AppDef, data), roles=roles)


def _fields(obj: Any, path: str, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The fields of ``obj`` that differ from their defaults (the rest come back as defaults)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name in skip:
            continue
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING and value == f.default:
            continue
        if f.default_factory is not dataclasses.MISSING and value == f.default_factory():
            continue
        if not isinstance(value, str | int | float | bool | type(None)):
            _check_json(value, f"{path}.{f.name}")
        out[f.name] = value
    return out


def _check_json(value: Any, path: str) -> None:
    try:
        json.dumps(value)
    except (TypeError, ValueError) as e:
        raise SpecError(path, None, f"is not JSON data ({e})",
                            fix="use str/int/float/bool/list/dict values, or pass a component reference instead") from e  # fmt: skip


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)} - {"roles", "resource", "mounts", "retry_policy"}
    structural = {"version", "kind", "roles", "resource", "mounts", "retry_policy"}
    unknown = sorted(k for k in data if k not in names and k not in structural)
    if unknown:
        raise SpecError(f"app.{unknown[0]}", None, f"this TorchX has no {cls.__name__} field {unknown[0]!r}",
                        fix="install the TorchX (release or nightly) the pipeline was built with")  # fmt: skip
    return {k: v for k, v in data.items() if k in names}
