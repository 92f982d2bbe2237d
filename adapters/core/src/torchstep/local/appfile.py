"""An AppDef as a JSON file (``torchstep run --app FILE.json``): the fields of
``torchx.specs.AppDef`` as ``dataclasses.asdict`` writes them.

Mounts are told apart by their keys (``src`` → VolumeMount, ``permissions`` → DeviceMount,
else BindMount) or an explicit ``"type"``; a TorchX mount string
(``"type=bind,src=/data,dst=/data"``) works too. ``retry_policy`` is a RetryPolicy name.

Example::

    >>> import torchstep
    >>> from torchstep.local.appfile import app_from_dict, app_to_dict
    >>> app = torchstep.materialize("utils.sh", ["echo", "hi"])
    >>> app_from_dict(app_to_dict(app)) == app
    True
"""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

from torchstep.errors import SpecError


def app_to_dict(app: Any) -> dict[str, Any]:
    """``app`` as JSON-ready data (enums by name).

    Args:
        app: the ``torchx.specs.AppDef``.
    """

    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.name
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    data: dict[str, Any] = plain(dataclasses.asdict(app))
    return data


def load_app(path: str) -> Any:
    """Read an AppDef from a JSON file.

    Args:
        path: the JSON file (as :func:`app_to_dict` writes it).

    Returns:
        The ``torchx.specs.AppDef``.

    Raises:
        SpecError: the file cannot be read, is not JSON, or a field is malformed.
    """
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as e:
        raise SpecError("--app", None, f"cannot read {path}: {e.strerror}", fix="give an existing JSON file") from None
    except ValueError as e:
        raise SpecError("--app", None, f"{path} is not valid JSON: {e}", fix="fix the file") from None
    return app_from_dict(data)


def app_from_dict(data: Any) -> Any:
    """Build a ``torchx.specs.AppDef`` from :func:`app_to_dict`-style data.

    Args:
        data: the decoded JSON data.

    Returns:
        The AppDef.

    Raises:
        SpecError: a malformed field, naming it.
    """
    from torchx import specs

    if not isinstance(data, dict) or not isinstance(data.get("roles"), list):
        raise SpecError("app", None, "an AppDef JSON object needs 'name' and a list 'roles'", fix="see docs/local.md")
    extra = set(data) - {"name", "roles", "metadata"}
    if extra:
        raise SpecError(f"app.{sorted(extra)[0]}", None, "not an AppDef field", fix="use name, roles, metadata")
    if not isinstance(data.get("name", ""), str) or not isinstance(data.get("metadata") or {}, dict):
        raise SpecError("app", None, "'name' must be a string and 'metadata' an object", fix="see docs/local.md")
    roles = [_role(i, r) for i, r in enumerate(data["roles"])]
    return specs.AppDef(name=data.get("name", ""), roles=roles, metadata=data.get("metadata") or {})


def _role(i: int, data: Any) -> Any:
    from torchx import specs

    path = f"roles[{i}]"
    if not isinstance(data, dict):
        raise SpecError(path, None, "a role is a JSON object", fix="see docs/local.md")
    known = {f.name for f in dataclasses.fields(specs.Role)}  # this TorchX version's fields
    extra = set(data) - known
    if extra:
        raise SpecError(f"{path}.{sorted(extra)[0]}", None, "not a Role field", fix=f"use {', '.join(sorted(known))}")
    kw = dict(data)
    if "resource" in kw:
        res = kw["resource"]
        if not isinstance(res, dict):
            raise SpecError(f"{path}.resource", None, "must be an object", fix='{"cpu": 1, "gpu": 0, "memMB": 1024}')
        kw["resource"] = specs.Resource(
            cpu=res.get("cpu", -1),
            gpu=res.get("gpu", -1),
            memMB=res.get("memMB", -1),
            capabilities=res.get("capabilities") or {},
            devices=res.get("devices") or {},
        )
    if "retry_policy" in kw:
        name = kw["retry_policy"]
        if not isinstance(name, str) or name not in specs.RetryPolicy.__members__:
            raise SpecError(
                f"{path}.retry_policy",
                None,
                f"unknown retry policy {name!r}",
                fix=f"one of {', '.join(specs.RetryPolicy.__members__)}",
            )
        kw["retry_policy"] = specs.RetryPolicy[name]
    if "mounts" in kw:
        if not isinstance(kw["mounts"], list | type(None)):
            raise SpecError(
                f"{path}.mounts", None, "must be a list", fix='[{"src_path": "/data", "dst_path": "/data"}]'
            )
        kw["mounts"] = [_mount(f"{path}.mounts[{j}]", m) for j, m in enumerate(kw["mounts"] or [])]
    for key, kind in (("name", str), ("image", str), ("entrypoint", str), ("args", list), ("env", dict)):
        if key in kw and not isinstance(kw[key], kind):
            raise SpecError(
                f"{path}.{key}",
                None,
                f"must be a JSON {'string' if kind is str else kind.__name__}",
                fix="see docs/local.md",
            )
    try:
        return specs.Role(**kw)
    except (TypeError, ValueError) as e:
        raise SpecError(
            path, None, f"not a Role: {e}", fix="a role needs at least name, image and entrypoint"
        ) from None


def _mount(path: str, m: Any) -> Any:
    from torchx import specs

    if isinstance(m, str):
        try:
            return specs.parse_mounts(m.split(","))[0]
        except (KeyError, ValueError, IndexError, TypeError) as e:
            raise SpecError(
                path,
                None,
                f"not a TorchX mount string: {m!r} ({e})",
                fix="type=bind,src=/host,dst=/container[,readonly]",
            ) from None
    if not isinstance(m, dict):
        raise SpecError(path, None, "a mount is an object or a TorchX mount string", fix="type=bind,src=...,dst=...")
    m = dict(m)
    kind = m.pop("type", None)
    if kind not in (None, "bind", "volume", "device"):
        raise SpecError(f"{path}.type", None, f"unknown mount type {kind!r}", fix="bind, volume or device")
    kind = kind or ("volume" if "src" in m else "device" if "permissions" in m else "bind")
    try:
        cls = {"bind": specs.BindMount, "volume": specs.VolumeMount, "device": specs.DeviceMount}[kind]
        return cls(**m)
    except (KeyError, TypeError) as e:
        raise SpecError(path, None, f"not a {kind} mount: {e}", fix="see torchx.specs.BindMount/VolumeMount") from None
