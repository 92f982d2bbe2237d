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
    """``app`` (a ``torchx.specs.AppDef``) as JSON data (see the module docstring).

    Args:
        app: the AppDef.

    Returns:
        JSON-ready data (``"version": 1``, enums by name).
    """
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
    """The ``torchx.specs.AppDef`` of :func:`app_to_dict`'s ``data``.

    ``data`` may come from the network (a DAG run's conf, a flow run's parameters): every
    field is checked for its type first, and anything malformed is a
    :class:`~torchstep.SpecError` naming the field (``app.roles[0].args[1]``), never a
    ``TypeError`` from deep inside TorchX.

    Args:
        data: the decoded JSON data.

    Returns:
        The ``torchx.specs.AppDef``.

    Raises:
        SpecError: a malformed field, an unknown version or key, naming the field.

    >>> app_from_dict({"version": 1, "name": "a", "roles": [{"name": "w", "image": "", "entrypoint": ["sh"]}]})
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: app.roles[0].entrypoint: must be a string, got list; fix: e.g. "python"
    """
    from torchx import specs

    if not isinstance(data, dict) or data.get("version") != APP_JSON_VERSION:
        raise SpecError(
            "app",
            None,
            f"not an AppDef of layout {APP_JSON_VERSION}",
            fix="build the step with the same torchstep version as the image runs",
        )
    _check_types(data, _APP_TYPES, "app", required=("name", "roles"))
    roles = []
    for i, r in enumerate(data["roles"]):
        path = f"app.roles[{i}]"
        if not isinstance(r, dict):
            raise SpecError(path, None, f"must be a mapping, got {type(r).__name__}", fix="see torchx.specs.Role")
        _check_types(r, _ROLE_TYPES, path, required=("name", "image", "entrypoint"))
        r = dict(r)
        res = r.pop("resource", {})
        _check_types(res, _RESOURCE_TYPES, f"{path}.resource", required=())
        resource = specs.Resource(
            **{"cpu": 1, "gpu": 0, "memMB": 1024, **_known(specs.Resource, res, f"{path}.resource")}
        )
        mounts = []
        for j, m in enumerate(r.pop("mounts", [])):
            if not isinstance(m, dict) or m.get("kind") not in _MOUNT_KINDS:
                raise SpecError(
                    f"{path}.mounts[{j}]", None, "not a mount", fix=f"kind: one of {', '.join(_MOUNT_KINDS)}"
                )
            _check_types(m, _MOUNT_TYPES, f"{path}.mounts[{j}]", required=())
            try:
                mounts.append(getattr(specs, m["kind"])(**_known(getattr(specs, m["kind"]), m, f"{path}.mounts[{j}]")))
            except TypeError as e:
                raise SpecError(f"{path}.mounts[{j}]", None, str(e), fix="see torchx.specs." + m["kind"]) from None
        policy_name = r.pop("retry_policy", "APPLICATION")
        if policy_name not in specs.RetryPolicy.__members__:
            raise SpecError(
                f"{path}.retry_policy",
                None,
                f"unknown policy {policy_name!r}",
                fix=f"one of {', '.join(specs.RetryPolicy.__members__)}",
            )
        policy = specs.RetryPolicy[policy_name]
        roles.append(specs.Role(**_known(specs.Role, r, path), resource=resource, mounts=mounts, retry_policy=policy))
    return specs.AppDef(**_known(specs.AppDef, data), roles=roles)


# field -> (what it must be, an example fix). Checked before anything is constructed.
_STR, _INT, _NUM = "a string", "an integer", "a number"
_STRS, _STRMAP, _MAP = "a list of strings", "a mapping of strings to strings", "a mapping"
_APP_TYPES = {"name": (_STR, '"train"'), "roles": ("a non-empty list", "[{...role...}]"), "metadata": (_MAP, "{}")}
_ROLE_TYPES = {
    "name": (_STR, '"trainer"'),
    "image": (_STR, '"python:3.11"'),
    "entrypoint": (_STR, '"python"'),
    "base_image": (_STR, "null"),
    "args": (_STRS, '["--lr", "0.1"]'),
    "env": (_STRMAP, '{"LOGLEVEL": "INFO"}'),
    "num_replicas": (_INT, "1"),
    "min_replicas": (_INT, "null"),
    "max_retries": (_INT, "0"),
    "port_map": ("a mapping of strings to integers", '{"tb": 6006}'),
    "metadata": (_MAP, "{}"),
    "retry_policy": (_STR, '"APPLICATION"'),
    "resource": (_MAP, '{"cpu": 1, "gpu": 0, "memMB": 1024}'),
    "mounts": ("a list", "[]"),
    "workspace": ("JSON data", "null"),
    "overrides": (_MAP, "{}"),
}
_RESOURCE_TYPES = {
    "cpu": (_NUM, "1"),
    "gpu": (_INT, "0"),
    "memMB": (_INT, "1024"),
    "capabilities": (_MAP, "{}"),
    "devices": ("a mapping of strings to integers", "{}"),
    "tags": (_MAP, "{}"),
}
_MOUNT_TYPES = {
    "kind": (_STR, '"BindMount"'),
    "src_path": (_STR, '"/data"'),
    "dst_path": (_STR, '"/data"'),
    "src": (_STR, '"pvc-name"'),
    "read_only": ("a boolean", "false"),
    "permissions": (_STR, '"rwm"'),
}


def _is(kind: str, value: Any) -> bool:
    def num(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    checks = {
        _STR: lambda v: isinstance(v, str),
        _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
        _NUM: num,
        _STRS: lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        _STRMAP: lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
        _MAP: lambda v: isinstance(v, dict),
        "a non-empty list": lambda v: isinstance(v, list) and bool(v),
        "a list": lambda v: isinstance(v, list),
        "a boolean": lambda v: isinstance(v, bool),
        "a mapping of strings to integers": lambda v: (
            isinstance(v, dict) and all(isinstance(x, int) and not isinstance(x, bool) for x in v.values())
        ),
        "JSON data": lambda v: True,
    }
    return checks[kind](value)


def _check_types(data: dict[str, Any], table: dict[str, tuple[str, str]], path: str, required: tuple[str, ...]) -> None:
    for key in required:
        if key not in data:
            raise SpecError(f"{path}.{key}", None, "is missing", fix=f"e.g. {table[key][1]}")
    for key, value in data.items():
        if key in table and not (value is None and key in ("min_replicas", "base_image", "workspace")):
            kind, example = table[key]
            if not _is(kind, value):
                raise SpecError(
                    f"{path}.{key}", None, f"must be {kind}, got {type(value).__name__}", fix=f"e.g. {example}"
                )


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
        raise SpecError(
            path,
            None,
            f"is not JSON data ({e})",
            fix="use str/int/float/bool/list/dict values, or pass a component reference instead",
        ) from e


def _known(cls: type, data: dict[str, Any], path: str = "app") -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)} - {"roles", "resource", "mounts", "retry_policy"}
    structural = {"version", "kind", "roles", "resource", "mounts", "retry_policy"}
    unknown = sorted(k for k in data if k not in names and k not in structural)
    if unknown:
        raise SpecError(
            f"{path}.{unknown[0]}",
            None,
            f"this TorchX has no {cls.__name__} field {unknown[0]!r}",
            fix="install the TorchX (release or nightly) the pipeline was built with",
        )
    return {k: v for k, v in data.items() if k in names}
