"""Rules for ``Role.metadata`` (the ``torchstep`` options, the ``kubernetes`` pod-spec
overlay, other tools' keys), secrets by reference, TorchX-nightly-only fields and fields
of a TorchX newer than this rule book. Part of the rule book behind
:func:`torchstep.build_plan`.

Example::

    >>> from torchx.specs import Role
    >>> rec = Recorder(app=None, target="kubernetes")
    >>> role = Role("t", image="img", metadata={"torchstep": {"timeout": 3600}, "mlflow": {"run": "1"}})
    >>> role_options(rec, "roles[0]", role)
    {'timeout': 3600.0}
    >>> other_metadata(rec, "roles[0]", role)
    >>> [(d.field, d.action) for d in rec.decisions]
    [("roles[0].metadata['mlflow']", 'ignored')]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torchstep.contract import ENV_GRACE_PERIOD, ENV_HANG_TIMEOUT, ENV_HEARTBEAT_TIMEOUT
from torchstep.plan.limits import MAX_NPROC
from torchstep.plan.model import ROLE_OPTIONS, SecretRef
from torchstep.plan.names import is_dns_subdomain, is_env_name
from torchstep.plan.rules.record import Recorder, Wording, is_int

#: What a metadata field becomes on each target.
BECOMES: dict[str, Wording] = {
    "secret_env": {
        "local": "the environment variable {env} of the launching process, checked at launch",
        "kubernetes": "env valueFrom.secretKeyRef (the value never appears in the manifest)",
        "kfp": "kfp.kubernetes.use_secret_as_env({secret!r}, {{{key!r}: {env!r}}})",
    },
}


def role_options(rec: Recorder, p: str, role: Any) -> dict[str, Any]:
    """``role.metadata["torchstep"]``: the validated options. Unknown keys and bad
    values are rejected here; the honoured rows are recorded by the rules that use
    them (``launch``, ``retry_options``, ``secret_env``)."""
    md = role.metadata if isinstance(role.metadata, dict) else {}
    opts = md.get("torchstep")
    if opts is None:
        return {}
    base = f"{p}.metadata['torchstep']"
    if not isinstance(opts, dict):
        raise rec.fail(base, opts, "must be a dict", f"keys: {', '.join(ROLE_OPTIONS)}")
    if not opts:
        rec.ok(base, {}, "no torchstep options")
    out: dict[str, Any] = {}
    for k, v in opts.items():
        path = f"{base}[{k!r}]"
        if k not in ROLE_OPTIONS:
            rec.reject(path, v, f"unknown torchstep option {k!r}", f"use one of: {', '.join(ROLE_OPTIONS)}")
        elif k == "secret_env":
            if not isinstance(v, dict):
                rec.reject(path, v, "must map ENV_NAME to 'secret-name/key'", "{'HF_TOKEN': 'hf-token/token'}")
            else:
                out[k] = v
        elif k == "nproc_per_node":
            if not is_int(v) or not 1 <= v <= MAX_NPROC:
                rec.reject(path, v, f"must be an integer in 1..{MAX_NPROC}", "e.g. 2")
            else:
                out[k] = v
        elif k == "retry_backoff":
            if isinstance(v, bool) or not isinstance(v, int | float) or not 1 <= v <= 100:
                rec.reject(path, v, "must be a number in 1..100", "e.g. 2.0")
            else:
                out[k] = float(v)
        else:
            s = rec.seconds(path, v)
            if s is not None:
                out[k] = s
    return out


def agent_options(rec: Recorder, p: str, opts: Mapping[str, Any], own_torchrun: bool) -> None:
    """Rows of the timeout / heartbeat_timeout / hang_timeout / grace_period options."""
    base = f"{p}.metadata['torchstep']"
    if "timeout" in opts:
        rec.ok(
            f"{base}['timeout']",
            f"{opts['timeout']:g}",
            f"role timeout {opts['timeout']:g} s: every replica of the role is stopped after it",
        )
    for key, flag, env in (
        ("heartbeat_timeout", "--heartbeat-timeout", ENV_HEARTBEAT_TIMEOUT),
        ("hang_timeout", "--hang-timeout", ENV_HANG_TIMEOUT),
        ("grace_period", "--grace-period", ENV_GRACE_PERIOD),
    ):
        if key in opts:
            how = f"{env}={opts[key]:g} for the role's own torchrun" if own_torchrun else f"{flag} {opts[key]:g}"
            rec.ok(f"{base}[{key!r}]", f"{opts[key]:g}", f"agent {how}")


def role_secret_env(rec: Recorder, p: str, spec: Any, env: Mapping[str, str]) -> tuple[SecretRef, ...]:
    """``role.metadata["torchstep"]["secret_env"]``: ``{ENV: "secret-name/key"}``."""
    if spec is None:
        return ()
    path = f"{p}.metadata['torchstep']['secret_env']"
    if not isinstance(spec, dict):
        raise rec.fail(path, spec, "must map ENV_NAME to 'secret-name/key'", "{'HF_TOKEN': 'hf-token/token'}")
    if not spec:
        rec.ok(path, {}, "no secrets")
    refs = []
    for env_name, ref in spec.items():
        sub = f"{path}[{env_name!r}]"
        if not isinstance(env_name, str) or not is_env_name(env_name):
            rec.reject(sub, env_name, "not a valid environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
            continue
        if env_name in env:
            rec.reject(sub, ref, f"{env_name} is also set by value in env", "keep it in one place")
            continue
        secret, sep, key = ref.partition("/") if isinstance(ref, str) else ("", "", "")
        if not sep or not is_dns_subdomain(secret) or not _secret_key_ok(key):
            rec.reject(
                sub,
                ref,
                "must be 'secret-name/key': a DNS-1123 secret name and a key of [-._a-zA-Z0-9]",
                "e.g. 'hf-token/token'",
            )
            continue
        refs.append(SecretRef(env_name, secret, key))
        rec.ok(sub, ref, rec.on_target(BECOMES["secret_env"], env=env_name, secret=secret, key=key))
    return tuple(refs)


def other_metadata(rec: Recorder, p: str, role: Any) -> None:
    md = role.metadata if isinstance(role.metadata, dict) else None
    if md is None:
        raise rec.fail(f"{p}.metadata", role.metadata, "must be a dict", "Role(metadata={...})")
    if not md:
        rec.ok(f"{p}.metadata", {}, "none")
    for key, value in md.items():
        path = f"{p}.metadata[{key!r}]"
        if key == "torchstep":
            continue
        if key == "kubernetes":
            if not isinstance(value, dict):
                rec.reject(path, value, "must be a partial pod spec (dict)", "{'nodeSelector': {...}}")
            elif rec.target == "local":
                rec.ignore(path, value, "a pod spec overlay has no meaning on one machine")
            elif rec.target == "kubernetes":
                rec.ok(path, value, "merged into the rendered pod spec (TorchX nightly convention)")
            else:
                rec.ok(
                    path,
                    value,
                    "mapped to kfp-kubernetes calls where expressible (else a SpecError from the KFP adapter)",
                )
        else:
            rec.ignore(path, value, "metadata for other tools; torchstep reads 'torchstep' and 'kubernetes'")


def nightly_fields(rec: Recorder, p: str, role: Any) -> None:
    """``Role.workspace`` and ``Role.overrides`` exist in TorchX nightly only: read by name."""
    if hasattr(role, "workspace"):
        ws = role.workspace
        if ws:
            rec.reject(
                f"{p}.workspace",
                ws,
                "torchstep runs the image as is and does not build workspaces",
                "bake the code into the image, or use a directory image on the local target",
            )
        else:
            rec.ok(f"{p}.workspace", ws, "unset")
    if hasattr(role, "overrides"):
        ov = role.overrides
        if ov:
            rec.reject(
                f"{p}.overrides",
                ov,
                "scheduler request overrides are specific to TorchX's own schedulers",
                "use role.metadata['kubernetes'] for pod spec changes",
            )
        else:
            rec.ok(f"{p}.overrides", ov, "unset")


def unknown_fields(rec: Recorder, prefix: str, obj: Any, known: frozenset[str]) -> None:
    """Fields of a newer TorchX: rejected when set, noted when unset."""
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        if f.name in known:
            continue
        value = getattr(obj, f.name, None)
        path = f"{prefix}{f.name}"
        if value is None or (isinstance(value, str | list | tuple | dict | set) and not value):
            rec.ignore(path, value, "a field of a newer TorchX that torchstep does not know; it is unset")
        else:
            rec.reject(
                path,
                value,
                "a field of a newer TorchX that torchstep does not know how to honour",
                "leave it unset, or upgrade torchstep",
            )


def _secret_key_ok(key: str) -> bool:
    return bool(key) and len(key) <= 253 and all(c.isascii() and (c.isalnum() or c in "-._") for c in key)
