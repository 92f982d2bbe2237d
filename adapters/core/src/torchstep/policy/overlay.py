"""``role.metadata["kubernetes"]`` under a policy: a pod spec overlay from the network may
add what a pod needs (tolerations, node selectors, sidecars, volumes of the pod's own),
never what reaches the node or lifts the container's confinement.

Mode ``unprivileged`` (the default) walks every pod and container field, wherever it is
nested (``containers``, ``initContainers``, ``ephemeralContainers``, ``volumes``, TorchX
nightly's ``{"spec": ..., "metadata": ...}``), against allow-lists: pod fields, volume
kinds, extended resources, token audiences and node-local profiles pass only when the
policy lists them, and a field Kubernetes adds later is refused until someone decides about
it. Images, service accounts, Secrets, claims, env names and the grace period in it are
checked like the AppDef's own.

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

from torchstep.policy.rules import DEPLOYMENT_OWN, PolicyError, listed, named, norm_path, under

# unprivileged mode: container fields an overlay may set (anything else is refused: a field
# Kubernetes adds later is refused until a person decides about it); the pod's own are the
# policy's ``pod_fields``
_POD_HOST = frozenset({"hostPID", "hostNetwork", "hostIPC"})
_CONTAINER_FREE = frozenset(
    {
        "args",
        "command",
        "imagePullPolicy",
        "name",
        "resizePolicy",
        "restartPolicy",
        "stdin",
        "stdinOnce",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "tty",
        "volumeDevices",
        "volumeMounts",
        "workingDir",
        "targetContainerName",
    }
)
# probes and lifecycle hooks: the kubelet runs their httpGet/tcpSocket from the node's network
_PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
_CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")
_PROJECTION_FREE = frozenset({"configMap", "downwardAPI", "clusterTrustBundle"})
# resources every pod may ask for by name (amounts are the policy's cpu/memMB limits)
_NATIVE_RESOURCES = ("cpu", "memory", "ephemeral-storage", "hugepages-*")
# an ephemeral volume's claim template: a fresh, empty claim of the pod's own
_CLAIM_SPEC_FREE = frozenset(
    {"accessModes", "resources", "storageClassName", "volumeMode", "volumeAttributesClassName"}
)


def seconds(value: Any) -> float | None:
    """``value`` (a number or numeric text) as seconds; ``None`` when it is not one.

    Args:
        value: the value as sent.

    >>> seconds("30"), seconds(2147483647), seconds("soon"), seconds(True)
    (30.0, 2147483647.0, None, None)
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        s = float(value)
    except (ValueError, OverflowError):
        return None
    return s if s == s and s >= 0 else None  # NaN is not a duration


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
                yield c.error(
                    sub,
                    f"pod {key} are not allowed by the deployment's policy",
                    f"remove them, or the deployment lists {key!r} in the policy's options",
                )
            elif key == "annotations" and isinstance(value, Mapping):
                yield from c.annotations(sub, dict(value))
    else:
        path_spec = path
    if not isinstance(spec, Mapping):
        yield c.error(path_spec, "must be a mapping", "{'nodeSelector': {...}}")
        return
    for key, value in spec.items():
        sub = f"{path_spec}[{key!r}]"
        if key in _POD_HOST:
            if value is not False:
                yield c.error(
                    sub,
                    f"{key} gives the pod the node's {key[4:].lower()} namespace",
                    "remove it (policy overlay = 'unprivileged')",
                )
        elif key == "terminationGracePeriodSeconds":
            yield from c.grace(sub, value)
        elif key == "automountServiceAccountToken":
            if value is not False and key not in c.p.pod_fields:
                yield c.error(
                    sub,
                    "a service account token for the Kubernetes API in the pod is not allowed by "
                    "the deployment's policy",
                    "remove it (or set it false), or the deployment lists "
                    "'automountServiceAccountToken' in the policy's pod_fields",
                )
        elif key in c.p.pod_fields and key not in _CHECKED_POD_FIELDS:
            continue
        elif key in ("serviceAccountName", "serviceAccount"):
            if not isinstance(value, str) or not (
                value == DEPLOYMENT_OWN["service_account"] or named(value, c.p.service_accounts)
            ):
                yield c.error(
                    sub,
                    f"service account {value!r} is not allowed by the deployment's policy",
                    f"remove it, or use one of: {listed(c.p.service_accounts)} (policy service_accounts)",
                )
        elif key == "priorityClassName":
            if "priority_class" not in c.p.options:
                yield c.error(
                    sub,
                    "a priority class is not allowed by the deployment's policy",
                    "remove it, or the deployment lists 'priority_class' in the policy's options",
                )
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
            yield from _resources(c, sub, value)
        else:
            why = {
                "securityContext": "the pod's security context is not for a run request to set",
                "nodeName": "nodeName bypasses the scheduler and picks a node",
                "runtimeClassName": "the runtime class decides the pod's isolation from the node",
                "resources": "the deployment's policy limits resources: set them in Role.resource",
                "resourceClaims": "a resource claim allocates devices (dynamic resource allocation)",
            }.get(key, "this pod spec field is not one the deployment's policy allows")
            fix = (
                "remove it (policy overlay = 'unprivileged')"
                if key == "resources"
                else (f"remove it, or the deployment lists {key!r} in the policy's pod_fields")
            )
            yield c.error(sub, why, fix)


# pod fields checked above whatever pod_fields says (listing them there changes nothing)
_CHECKED_POD_FIELDS = frozenset(
    {
        *_POD_HOST,
        "terminationGracePeriodSeconds",
        "automountServiceAccountToken",
        "serviceAccountName",
        "serviceAccount",
        "priorityClassName",
        "imagePullSecrets",
        "volumes",
        *_CONTAINER_LISTS,
        "resources",
    }
)


def _handler(c: Any, path: str, handler: Any) -> Iterator[PolicyError]:
    """A probe or lifecycle hook: the kubelet sends its ``httpGet``/``tcpSocket`` from the
    node, so a ``host`` other than the pod's own would reach what the node reaches."""
    if not isinstance(handler, Mapping):
        yield c.error(path, "must be a mapping", "{'httpGet': {'path': '/healthz', 'port': 8080}}")
        return
    for kind in ("httpGet", "tcpSocket"):
        action = handler.get(kind)
        if isinstance(action, Mapping) and "host" in action:
            yield c.error(
                f"{path}[{kind!r}]['host']",
                "the kubelet would connect from the node to another host",
                "remove host (the pod's own IP is used)",
            )


def _resources(c: Any, path: str, res: Any) -> Iterator[PolicyError]:
    """An overlay's ``resources`` (pod or container) when the policy sets no cpu/gpu/memory
    limit: requests and limits only (no ``claims``), each name native or an allowed
    extended resource."""
    if not isinstance(res, Mapping):
        yield c.error(path, "must be a mapping", "{'limits': {'cpu': '2'}}")
        return
    for part, amounts in res.items():
        sub = f"{path}[{part!r}]"
        if part not in ("requests", "limits"):
            why = (
                "a resource claim allocates devices (dynamic resource allocation)"
                if part == "claims"
                else ("this resources field is not one the deployment's policy allows")
            )
            yield c.error(sub, why, "remove it (policy overlay = 'unprivileged')")
            continue
        if not isinstance(amounts, Mapping):
            yield c.error(sub, "must be a mapping", "{'cpu': '2', 'memory': '4Gi'}")
            continue
        for name in amounts:
            if not (isinstance(name, str) and named(name, _NATIVE_RESOURCES)):
                yield from c.extended_resource(f"{sub}[{name!r}]", name)


def _limited(p: Any) -> bool:
    return any(v is not None for v in (p.gpu, p.cpu, p.memMB))


def _container(c: Any, path: str, item: Any) -> Iterator[PolicyError]:
    if not isinstance(item, Mapping):
        yield c.error(path, "must be a mapping", "{'name': 'main', ...}")
        return
    for key, value in item.items():
        sub = f"{path}[{key!r}]"
        if key in _CONTAINER_FREE:
            continue
        if key == "resources" and not _limited(c.p):
            yield from _resources(c, sub, value)
        elif key in _PROBES:
            yield from _handler(c, sub, value)
        elif key == "lifecycle" and not isinstance(value, Mapping):
            yield c.error(sub, "must be a mapping", "{'preStop': {'sleep': {'seconds': 5}}}")
        elif key == "lifecycle":
            for hook, handler in value.items():
                yield from _handler(c, f"{sub}[{hook!r}]", handler)
        elif key == "image":
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
                    yield c.error(
                        f"{sub}[{i}]",
                        "a host port opens the node's network to the pod",
                        "remove hostPort (policy overlay = 'unprivileged')",
                    )
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
        if key in ("readOnlyRootFilesystem", "runAsNonRoot") or (
            key in ("privileged", "allowPrivilegeEscalation") and value is False
        ):
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
        if key in ("seccompProfile", "appArmorProfile") and isinstance(value, Mapping):
            kind, profile = value.get("type"), value.get("localhostProfile")
            if kind == "RuntimeDefault" and set(value) == {"type"}:
                continue
            if kind == "Localhost" and set(value) <= {"type", "localhostProfile"}:
                if isinstance(profile, str) and named(profile, c.p.localhost_profiles):
                    continue
                yield c.error(
                    sub,
                    f"node-local profile {profile!r} is not one the deployment's policy allows "
                    "(a profile on the node can allow any system call)",
                    f"use type RuntimeDefault, or one of: {listed(c.p.localhost_profiles)} (policy localhost_profiles)",
                )
                continue
        yield c.error(
            sub,
            f"{key}={value!r} raises the container's privileges or lifts its confinement",
            "remove it (policy overlay = 'unprivileged')",
        )


def _volume(c: Any, path: str, vol: Any) -> Iterator[PolicyError]:
    if not isinstance(vol, Mapping):
        yield c.error(path, "must be a mapping", "{'name': 'cache', 'emptyDir': {}}")
        return
    for key, value in vol.items():
        sub = f"{path}[{key!r}]"
        if key == "name":
            continue
        if key == "hostPath":  # the node's files: what a BindMount may reach, nothing more
            src = value.get("path") if isinstance(value, Mapping) else None
            norm = norm_path(src)
            if norm is None or not under(norm, c.p.bind_mounts):
                yield c.error(
                    sub,
                    f"a hostPath volume of {src!r} mounts the node's files",
                    f"use a VolumeMount of an allowed claim, or a path under: {listed(c.p.bind_mounts)} "
                    "(policy bind_mounts)",
                )
            continue
        if key not in c.p.volume_sources:
            yield c.error(
                sub,
                f"a {key} volume is not a kind the deployment's policy allows",
                f"use one of: {listed(c.p.volume_sources)} (policy volume_sources), or a VolumeMount "
                "of an allowed claim",
            )
        elif key == "persistentVolumeClaim":
            claim = value.get("claimName") if isinstance(value, Mapping) else None
            if not isinstance(claim, str) or not named(claim, c.p.volume_mounts):
                yield c.error(
                    sub,
                    f"volume claim {claim!r} is not allowed by the deployment's policy",
                    f"use one of: {listed(c.p.volume_mounts)} (policy volume_mounts)",
                )
        elif key == "secret":
            name = value.get("secretName") if isinstance(value, Mapping) else None
            if not isinstance(name, str) or not named(name, c.p.secrets):
                yield c.secret_error(sub, name)
        elif key == "projected":
            sources = value.get("sources") if isinstance(value, Mapping) else None
            for i, src in enumerate(sources if isinstance(sources, list) else [sources]):
                for kind, body in src.items() if isinstance(src, Mapping) else [("?", src)]:
                    at = f"{sub}['sources'][{i}][{kind!r}]"
                    if kind == "secret":
                        name = body.get("name") if isinstance(body, Mapping) else None
                        if not isinstance(name, str) or not named(name, c.p.secrets):
                            yield c.secret_error(at, name)
                    elif kind == "serviceAccountToken":
                        yield from _token(c, at, body)
                    elif kind not in _PROJECTION_FREE:
                        yield c.error(
                            f"{sub}['sources'][{i}]",
                            "this projected source is not one the deployment's policy allows",
                            "remove it",
                        )
        elif key == "ephemeral":
            yield from _claim_template(c, sub, value)


def _token(c: Any, path: str, body: Any) -> Iterator[PolicyError]:
    """A projected service account token: an audience the policy lists. Without one it is a
    token for the Kubernetes API itself, as ``automountServiceAccountToken`` gives."""
    audience = body.get("audience") if isinstance(body, Mapping) else None
    if audience is None and "automountServiceAccountToken" in c.p.pod_fields:
        return
    if audience is None:
        yield c.error(
            path,
            "a token for the Kubernetes API (no audience) is not allowed by the deployment's policy",
            "name an audience from the policy's token_audiences, or remove it",
        )
    elif not isinstance(audience, str) or not named(audience, c.p.token_audiences):
        yield c.error(
            f"{path}['audience']",
            f"a token for audience {audience!r} is not allowed by the deployment's policy",
            f"use one of: {listed(c.p.token_audiences)} (policy token_audiences)",
        )


def _claim_template(c: Any, path: str, value: Any) -> Iterator[PolicyError]:
    """An ephemeral volume: a new, empty claim. A ``dataSource``/``dataSourceRef`` would
    clone another claim or a snapshot; ``selector``/``volumeName`` would bind an existing volume."""
    template = value.get("volumeClaimTemplate") if isinstance(value, Mapping) else None
    spec = template.get("spec") if isinstance(template, Mapping) else None
    if not isinstance(spec, Mapping):
        yield c.error(path, "must hold volumeClaimTemplate.spec", "{'volumeClaimTemplate': {'spec': {...}}}")
        return
    for key, body in spec.items():
        sub = f"{path}['volumeClaimTemplate']['spec'][{key!r}]"
        if key in _CLAIM_SPEC_FREE:
            continue
        if key in ("dataSource", "dataSourceRef"):
            kind = body.get("kind") if isinstance(body, Mapping) else None
            name = body.get("name") if isinstance(body, Mapping) else None
            group = body.get("apiGroup") if isinstance(body, Mapping) else None
            if (
                kind == "PersistentVolumeClaim"
                and not group
                and isinstance(name, str)
                and named(name, c.p.volume_mounts)
            ):
                continue  # a copy of a claim the policy already lets the step mount
            yield c.error(
                sub,
                f"the claim would be filled from {kind or 'a source'} {name!r}, which the "
                "deployment's policy does not allow",
                "remove it (an ephemeral volume starts empty), "
                f"or clone a claim of: {listed(c.p.volume_mounts)} (policy volume_mounts)",
            )
        else:
            yield c.error(
                sub,
                "this claim template field is not one the deployment's policy allows "
                "(selector and volumeName bind an existing volume)",
                "remove it",
            )
