"""``role.metadata["kubernetes"]`` (a partial pod, see ``torchstep.kubernetes.overlay``) as
kfp-kubernetes calls: what KFP can express is mapped, anything else is a SpecError naming
the overlay field and the alternative — never dropped.

Mapped: ``nodeSelector`` → ``add_node_selector``; ``tolerations`` → ``add_toleration``;
``imagePullSecrets`` → ``set_image_pull_secrets``; ``volumes`` of kind ``emptyDir``,
``secret`` or ``persistentVolumeClaim`` mounted by the main container's ``volumeMounts`` →
``empty_dir_mount`` / ``use_secret_as_volume`` / ``mount_pvc``; pod ``labels`` and
``annotations`` → ``add_pod_label`` / ``add_pod_annotation``.

    >>> calls = overlay_calls({"tolerations": [{"key": "gpu", "operator": "Exists"}]}, "roles[0]")
    >>> calls
    [('add_toleration', {'key': 'gpu', 'operator': 'Exists'})]
    >>> overlay_calls({"hostNetwork": True}, "roles[0]")
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: roles[0].metadata['kubernetes']['hostNetwork'] (target 'kfp'): ...
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchstep import SpecError

TARGET = "kfp"
_TOLERATION_KEYS = {
    "key": "key",
    "operator": "operator",
    "value": "value",
    "effect": "effect",
    "tolerationSeconds": "toleration_seconds",
}
_FIX = "use the kubernetes target (Airflow/Prefect), or a multi-replica AppDef (KFP launcher step) whose pods take the full overlay"


def overlay_calls(overlay: Any, role_path: str) -> list[tuple[str, dict[str, Any]]]:
    """The kfp-kubernetes calls (function name, keyword arguments) of ``overlay``."""
    base = f"{role_path}.metadata['kubernetes']"
    if not isinstance(overlay, Mapping):
        raise SpecError(base, TARGET, "must be a partial pod spec (dict)", fix="{'tolerations': [...]}")
    calls: list[tuple[str, dict[str, Any]]] = []
    spec: Mapping[str, Any] = overlay
    if "spec" in overlay or "metadata" in overlay:  # TorchX nightly's V1Pod spelling
        for key in overlay:
            if key not in ("spec", "metadata"):
                raise _refuse(f"{base}[{key!r}]")
        meta = overlay.get("metadata") or {}
        for key, value in meta.items():
            if key not in ("labels", "annotations") or not isinstance(value, Mapping):
                raise _refuse(f"{base}['metadata'][{key!r}]")
            fn = "add_pod_label" if key == "labels" else "add_pod_annotation"
            arg = "label" if key == "labels" else "annotation"
            calls += [(fn, {f"{arg}_key": str(k), f"{arg}_value": str(v)}) for k, v in sorted(value.items())]
        spec = overlay.get("spec") or {}
        base = f"{base}['spec']"
    volumes = {str(v.get("name")): v for v in spec.get("volumes", []) if isinstance(v, Mapping)}
    for key, value in spec.items():
        path = f"{base}[{key!r}]"
        if key == "nodeSelector" and isinstance(value, Mapping):
            calls += [
                ("add_node_selector", {"label_key": str(k), "label_value": str(v)}) for k, v in sorted(value.items())
            ]
        elif key == "tolerations" and isinstance(value, list):
            for i, t in enumerate(value):
                if not isinstance(t, Mapping) or any(k not in _TOLERATION_KEYS for k in t):
                    raise _refuse(f"{path}[{i}]", "a toleration has key, operator, value, effect, tolerationSeconds")
                calls.append(("add_toleration", {_TOLERATION_KEYS[k]: v for k, v in t.items()}))
        elif key == "imagePullSecrets" and isinstance(value, list):
            names = [s.get("name") for s in value if isinstance(s, Mapping)]
            if len(names) != len(value) or not all(isinstance(n, str) and n for n in names):
                raise _refuse(path, "each item is {'name': secret}")
            calls.append(("set_image_pull_secrets", {"secret_names": names}))
        elif key == "volumes":
            continue  # through the containers' volumeMounts below
        elif key == "containers" and isinstance(value, list):
            calls += _mounts(value, volumes, path)
        else:
            raise _refuse(path)
    return calls


def _mounts(containers: list[Any], volumes: Mapping[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    calls: list[tuple[str, dict[str, Any]]] = []
    if len(containers) != 1 or not isinstance(containers[0], Mapping):
        raise _refuse(path, "a KFP task has one container: give one item with its volumeMounts")
    for key in containers[0]:
        if key not in ("name", "volumeMounts"):
            raise _refuse(f"{path}[0][{key!r}]")
    for i, m in enumerate(containers[0].get("volumeMounts", [])):
        mpath = f"{path}[0]['volumeMounts'][{i}]"
        if not isinstance(m, Mapping) or set(m) - {"name", "mountPath"}:
            raise _refuse(mpath, "only name and mountPath can be set on a KFP mount")
        vol = volumes.get(str(m.get("name")))
        if vol is None:
            raise SpecError(
                mpath, TARGET, f"no volume named {m.get('name')!r} in the overlay's volumes", fix="add it to volumes"
            )
        kinds = [k for k in vol if k != "name"]
        kind = kinds[0] if len(kinds) == 1 else None
        source = vol.get(kind) if kind else None
        if kind == "emptyDir" and isinstance(source, Mapping):
            args = {"volume_name": vol["name"], "mount_path": m["mountPath"]}
            if source.get("medium"):
                args["medium"] = source["medium"]
            if source.get("sizeLimit"):
                args["size_limit"] = str(source["sizeLimit"])
            calls.append(("empty_dir_mount", args))
        elif kind == "secret" and isinstance(source, Mapping) and source.get("secretName"):
            calls.append(("use_secret_as_volume", {"secret_name": source["secretName"], "mount_path": m["mountPath"]}))
        elif kind == "persistentVolumeClaim" and isinstance(source, Mapping) and source.get("claimName"):
            calls.append(("mount_pvc", {"pvc_name": source["claimName"], "mount_path": m["mountPath"]}))
        else:
            raise _refuse(
                f"{path}[0]['volumeMounts'][{i}] (volume {m.get('name')!r})",
                "KFP mounts emptyDir, secret and persistentVolumeClaim volumes",
            )
    return calls


def _refuse(path: str, detail: str = "") -> SpecError:
    what = "cannot be expressed in KFP (kfp-kubernetes has no such setting)"
    return SpecError(path, TARGET, f"{what}; {detail}" if detail else what, fix=_FIX)
