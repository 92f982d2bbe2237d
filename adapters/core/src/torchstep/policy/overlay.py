"""``role.metadata["kubernetes"]`` under a policy: a pod spec overlay from the network may
add what a pod needs (tolerations, node selectors, sidecars, volumes of the pod's own),
never what reaches the node or lifts the container's confinement.

Mode ``unprivileged`` (the default) walks every pod and container field, wherever it is
nested (``containers``, ``initContainers``, ``ephemeralContainers``, ``volumes``, TorchX
nightly's ``{"spec": ..., "metadata": ...}``), against an allowlist: a field Kubernetes adds
later is refused until someone decides about it. Images, service accounts, Secrets, claims
and env names in it are checked like the AppDef's own.

Example::

    >>> from torchstep.policy import DEFAULT
    >>> from torchstep.policy.checks import Checker
    >>> c = Checker(DEFAULT, "kubernetes")
    >>> [e.field for e in check_overlay(c, "o", {"initContainers": [{"name": "i", "securityContext": {"privileged": True}}]})]
    ["o['initContainers'][0]['securityContext']['privileged']"]
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from torchstep.policy.rules import DEPLOYMENT_OWN, PolicyError, listed, named

# unprivileged mode: pod and container fields an overlay may set (anything else is refused:
# a field Kubernetes adds later is refused until a person decides about it)
_POD_FREE = frozenset({
    "affinity", "automountServiceAccountToken", "dnsConfig", "dnsPolicy", "enableServiceLinks", "hostAliases",
    "hostname", "nodeSelector", "os", "overhead", "preemptionPolicy", "readinessGates", "resourceClaims",
    "restartPolicy", "schedulerName", "schedulingGates", "setHostnameAsFQDN", "shareProcessNamespace", "subdomain",
    "terminationGracePeriodSeconds", "tolerations", "topologySpreadConstraints", "activeDeadlineSeconds", "hostUsers",
})  # fmt: skip
_POD_HOST = frozenset({"hostPID", "hostNetwork", "hostIPC"})
_CONTAINER_FREE = frozenset({
    "args", "command", "imagePullPolicy", "lifecycle", "livenessProbe", "name", "readinessProbe", "resizePolicy",
    "restartPolicy", "startupProbe", "stdin", "stdinOnce", "terminationMessagePath", "terminationMessagePolicy",
    "tty", "volumeDevices", "volumeMounts", "workingDir", "targetContainerName",
})  # fmt: skip
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_VOLUME_FREE = frozenset({"emptyDir", "configMap", "downwardAPI", "ephemeral"})
_PROJECTION_FREE = frozenset({"configMap", "downwardAPI", "serviceAccountToken", "clusterTrustBundle"})


def check_overlay(c: Any, path: str, overlay: Any) -> Iterator[PolicyError]:
    """Check ``role.metadata["kubernetes"]`` (a pod spec, or TorchX nightly's ``{spec, metadata}``)
    against the policy's ``overlay`` mode, Secrets and service accounts.

    Args:
        c: the :class:`~torchstep.policy.checks.Checker` walking the AppDef.
        path: the overlay's field path.
        overlay: the overlay as it arrived.

    Yields:
        One :class:`PolicyError` per refused field.
    """
    mode = c.p.overlay
    if mode == "any" or overlay in (None, {}):
        return
    if mode == "none":
        yield c.error(
            path, "a pod spec overlay is not allowed by the deployment's policy", "remove it (policy overlay)"
        )
        return
    if not isinstance(overlay, Mapping):
        yield c.error(path, "must be a mapping", "{'nodeSelector': {...}}")
        return
    spec: Any = overlay
    if set(overlay) <= {"spec", "metadata"}:
        spec = overlay.get("spec", {})
        path_spec = f"{path}['spec']"
        meta = overlay.get("metadata", {})
        for key in meta if isinstance(meta, Mapping) else ():
            value, sub = meta[key], f"{path}['metadata'][{key!r}]"
            if key in ("labels", "annotations") and key not in c.p.options:
                yield c.error(sub, f"pod {key} are not allowed by the deployment's policy",
                              f"remove them, or the deployment lists {key!r} in the policy's options")  # fmt: skip
            elif key == "annotations" and isinstance(value, Mapping):
                yield from c.annotations(sub, dict(value))
    else:
        path_spec = path
    if not isinstance(spec, Mapping):
        yield c.error(path_spec, "must be a mapping", "{'nodeSelector': {...}}")
        return
    for key, value in spec.items():
        sub = f"{path_spec}[{key!r}]"
        if key in _POD_FREE:
            continue
        if key in _POD_HOST:
            if value is not False:
                yield c.error(sub, f"{key} gives the pod the node's {key[4:].lower()} namespace",
                              "remove it (policy overlay = 'unprivileged')")  # fmt: skip
        elif key in ("serviceAccountName", "serviceAccount"):
            if not isinstance(value, str) or not (
                value == DEPLOYMENT_OWN["service_account"] or named(value, c.p.service_accounts)
            ):
                yield c.error(sub, f"service account {value!r} is not allowed by the deployment's policy",
                              f"remove it, or use one of: {listed(c.p.service_accounts)} (policy service_accounts)")  # fmt: skip
        elif key == "priorityClassName":
            if "priority_class" not in c.p.options:
                yield c.error(sub, "a priority class is not allowed by the deployment's policy",
                              "remove it, or the deployment lists 'priority_class' in the policy's options")  # fmt: skip
        elif key == "imagePullSecrets":
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                name = item.get("name") if isinstance(item, Mapping) else item
                if not isinstance(name, str) or not named(name, c.p.secrets):
                    yield c.secret_error(f"{sub}[{i}]", name)
        elif key == "volumes":
            for i, vol in enumerate(value if isinstance(value, list) else [value]):
                yield from _volume(c, f"{sub}[{i}]", vol)
        elif key in _CONTAINER_LISTS:
            for i, item in enumerate(value if isinstance(value, list) else [value]):
                yield from _container(c, f"{sub}[{i}]", item)
        elif key == "resources" and not _limited(c.p):
            continue
        else:
            why = {
                "securityContext": "the pod's security context is not for a run request to set",
                "nodeName": "nodeName bypasses the scheduler and picks a node",
                "runtimeClassName": "the runtime class decides the pod's isolation from the node",
                "resources": "the deployment's policy limits resources: set them in Role.resource",
            }.get(key, "this pod spec field is not one the deployment's policy allows")
            yield c.error(sub, why, "remove it (policy overlay = 'unprivileged')")


def _limited(p: Any) -> bool:
    return any(v is not None for v in (p.gpu, p.cpu, p.memMB))


def _container(c: Any, path: str, item: Any) -> Iterator[PolicyError]:
    if not isinstance(item, Mapping):
        yield c.error(path, "must be a mapping", "{'name': 'main', ...}")
        return
    for key, value in item.items():
        sub = f"{path}[{key!r}]"
        if key in _CONTAINER_FREE or (key == "resources" and not _limited(c.p)):
            continue
        if key == "image":
            yield from c.image(sub, value)
        elif key == "env":
            for i, var in enumerate(value if isinstance(value, list) else [value]):
                var = var if isinstance(var, Mapping) else {}
                yield from c.env_name(f"{sub}[{i}]['name']", var.get("name"))
                ref = (
                    var.get("valueFrom", {}).get("secretKeyRef") if isinstance(var.get("valueFrom"), Mapping) else None
                )
                if ref is not None:
                    name = ref.get("name") if isinstance(ref, Mapping) else ref
                    if not isinstance(name, str) or not named(name, c.p.secrets):
                        yield c.secret_error(f"{sub}[{i}]['valueFrom']['secretKeyRef']", name)
        elif key == "ports":
            for i, port in enumerate(value if isinstance(value, list) else [value]):
                if not isinstance(port, Mapping) or "hostPort" in port or "hostIP" in port:
                    yield c.error(f"{sub}[{i}]", "a host port opens the node's network to the pod",
                                  "remove hostPort (policy overlay = 'unprivileged')")  # fmt: skip
        elif key == "securityContext":
            yield from _security_context(c, sub, value)
        else:
            why = {
                "envFrom": "envFrom imports variable names the policy cannot check",
                "resources": "the deployment's policy limits resources: set them in Role.resource",
            }.get(key, "this container field is not one the deployment's policy allows")
            yield c.error(sub, why, "remove it (policy overlay = 'unprivileged')")


def _security_context(c: Any, path: str, ctx: Any) -> Iterator[PolicyError]:
    if not isinstance(ctx, Mapping):
        yield c.error(path, "must be a mapping", "remove it (policy overlay = 'unprivileged')")
        return
    for key, value in ctx.items():
        sub = f"{path}[{key!r}]"
        if key in ("readOnlyRootFilesystem", "runAsNonRoot") or (key in ("privileged", "allowPrivilegeEscalation")
                                                                  and value is False):  # fmt: skip
            continue
        if (
            key == "capabilities"
            and isinstance(value, Mapping)
            and not value.get("add")
            and set(value) <= {"add", "drop"}
        ):
            continue
        if key in ("runAsUser", "runAsGroup") and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            continue
        if key == "procMount" and value == "Default":
            continue
        if key in ("seccompProfile", "appArmorProfile") and isinstance(value, Mapping) and value.get("type") in (
            "RuntimeDefault", "Localhost"
        ):  # fmt: skip
            continue
        yield c.error(sub, f"{key}={value!r} raises the container's privileges or lifts its confinement",
                      "remove it (policy overlay = 'unprivileged')")  # fmt: skip


def _volume(c: Any, path: str, vol: Any) -> Iterator[PolicyError]:
    if not isinstance(vol, Mapping):
        yield c.error(path, "must be a mapping", "{'name': 'cache', 'emptyDir': {}}")
        return
    for key, value in vol.items():
        sub = f"{path}[{key!r}]"
        if key == "name" or key in _VOLUME_FREE:
            continue
        if key == "persistentVolumeClaim":
            claim = value.get("claimName") if isinstance(value, Mapping) else None
            if not isinstance(claim, str) or not named(claim, c.p.volume_mounts):
                yield c.error(sub, f"volume claim {claim!r} is not allowed by the deployment's policy",
                              f"use one of: {listed(c.p.volume_mounts)} (policy volume_mounts)")  # fmt: skip
        elif key == "secret":
            name = value.get("secretName") if isinstance(value, Mapping) else None
            if not isinstance(name, str) or not named(name, c.p.secrets):
                yield c.secret_error(sub, name)
        elif key == "projected":
            sources = value.get("sources") if isinstance(value, Mapping) else None
            for i, src in enumerate(sources if isinstance(sources, list) else [sources]):
                for kind, body in src.items() if isinstance(src, Mapping) else [("?", src)]:
                    if kind == "secret":
                        name = body.get("name") if isinstance(body, Mapping) else None
                        if not isinstance(name, str) or not named(name, c.p.secrets):
                            yield c.secret_error(f"{sub}['sources'][{i}]['secret']", name)
                    elif kind not in _PROJECTION_FREE:
                        yield c.error(f"{sub}['sources'][{i}]", "this projected source is not one the deployment's policy allows",
                                      "remove it")  # fmt: skip
        else:
            why = "a hostPath volume mounts the node's files" if key == "hostPath" else (
                f"a {key} volume reaches storage outside the pod")  # fmt: skip
            yield c.error(sub, why, "use a VolumeMount of an allowed claim, or remove it (policy overlay)")
