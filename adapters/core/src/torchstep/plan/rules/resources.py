"""Rules for the hardware a role asks for: ``Role.resource`` (cpu, gpu, memMB, devices,
capabilities, nightly's tags), ``Role.mounts`` (BindMount, VolumeMount, DeviceMount) and
``Role.port_map``. Part of the rule book behind :func:`torchstep.build_plan`.

Example::

    >>> from torchx.specs import Resource, Role
    >>> rec = Recorder(app=None, target="kubernetes")
    >>> role = Role("r", image="img", resource=Resource(cpu=2, gpu=0, memMB=1024))
    >>> role_resources(rec, "roles[0]", role).mem_mb
    1024
    >>> rec.decisions[-1].becomes  # capabilities
    'none: no nodeSelector'
"""

from __future__ import annotations

import os
from typing import Any

from torchstep.contract import ENV_PORT_PREFIX
from torchstep.plan.limits import KNOWN_CAPABILITIES, MAX_CPU, MAX_GPU, MAX_MEM_MB
from torchstep.plan.model import RDZV_PORT_NAMES, Mount, Port, Resources
from torchstep.plan.names import env_suffix, is_dns_subdomain, is_extended_resource, is_label_value, is_port_name
from torchstep.plan.rules.record import Recorder, Rejected, Wording, is_int, show

#: What a role's hardware fields become on each target.
BECOMES: dict[str, Wording] = {
    "cpu": {
        "local": "CPU affinity of {cpu:g} core(s) per replica and OMP_NUM_THREADS",
        "kubernetes": "requests.cpu = limits.cpu = {cpu:g}",
        "kfp": "set_cpu_request/limit('{cpu:g}')",
    },
    "cpu_unset": {
        "local": "unset: every CPU of this machine",
        "kubernetes": "unset: no cpu request/limit (namespace defaults apply)",
        "kfp": "unset: no set_cpu_request/limit",
    },
    "gpu": {
        "local": "CUDA_VISIBLE_DEVICES partition of {gpu} GPU(s) per replica (checked at launch)",
        "kubernetes": "nvidia.com/gpu: {gpu} (requests and limits)",
        "kfp": "set_accelerator_type('nvidia.com/gpu') + set_accelerator_limit({gpu})",
    },
    "memMB": {
        "local": "",  # ignored: see the rule
        "kubernetes": "requests.memory = limits.memory = {mem}Mi",
        "kfp": "set_memory_request/limit('{mem}Mi')",
    },
    "memMB_unset": {
        "local": "unset",
        "kubernetes": "unset: no memory request/limit",
        "kfp": "unset: no memory request/limit",
    },
    "no_capabilities": {"local": "none", "kubernetes": "none: no nodeSelector", "kfp": "none: no add_node_selector"},
    "capability": {
        "local": "",  # ignored: see the rule
        "kubernetes": "nodeSelector {key}={value}",
        "kfp": "add_node_selector({key!r}, {value!r})",
    },
}
#: What a mount becomes on Kubernetes, per kind (KFP: only claims, see the rule).
K8S_MOUNTS = {
    "bind": "hostPath volume {src} at {dst}{ro}",
    "volume": "persistentVolumeClaim {src} at {dst}{ro}",
    "device": "hostPath {src} at {dst} + privileged securityContext "
    "(device cgroup access; permissions {perms!r} are not enforced beyond that)",
}


def role_resources(rec: Recorder, p: str, role: Any) -> Resources:
    """``roles[i].resource``: one row per Resource field on every target."""
    from torchx.specs import Resource

    res = getattr(role, "resource", None)
    path = f"{p}.resource"
    if not isinstance(res, Resource):
        raise rec.fail(path, res, "must be a torchx.specs.Resource", "use torchx.specs.Resource(...)")
    t = rec.target
    cpu = resource_amount(rec, f"{path}.cpu", res.cpu, MAX_CPU, allow_float=True)
    gpu = resource_amount(rec, f"{path}.gpu", res.gpu, MAX_GPU)
    mem = resource_amount(rec, f"{path}.memMB", res.memMB, MAX_MEM_MB)
    if cpu is not None:
        rec.ok(f"{path}.cpu", cpu, rec.on_target(BECOMES["cpu"], cpu=cpu))
    elif not rec.rejected_under(f"{path}.cpu"):
        rec.ok(f"{path}.cpu", res.cpu, rec.on_target(BECOMES["cpu_unset"]))
    if gpu is not None:
        rec.ok(f"{path}.gpu", gpu, rec.on_target(BECOMES["gpu"], gpu=gpu))
    elif not rec.rejected_under(f"{path}.gpu"):
        rec.ok(f"{path}.gpu", res.gpu, "no GPU requested")
    if mem is not None:
        if t == "local":
            rec.ignore(f"{path}.memMB", mem, "advisory on the local target: no memory limit is enforced")
        else:
            rec.ok(f"{path}.memMB", mem, rec.on_target(BECOMES["memMB"], mem=mem))
    elif not rec.rejected_under(f"{path}.memMB"):
        rec.ok(f"{path}.memMB", res.memMB, rec.on_target(BECOMES["memMB_unset"]))
    devices = resource_devices(rec, path, res)
    caps = resource_capabilities(rec, path, res)
    nightly_resource_fields(rec, path, res)
    return Resources(
        cpu=cpu,
        gpu=int(gpu or 0),
        mem_mb=int(mem) if mem is not None else None,
        devices=devices,
        capabilities=caps,
    )


def resource_amount(
    rec: Recorder, path: str, value: Any, limit: int, *, allow_float: bool = False
) -> float | int | None:
    """A resource amount: -1 (TorchX NULL_RESOURCE) and 0 mean unset (``None``);
    anything else must be in 1..limit."""
    kind = "a number" if allow_float else "an integer"
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and not allow_float):
        rec.reject(path, value, f"must be {kind}", "e.g. 2, or -1 for unset")
        return None
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        rec.reject(path, value, "must be a finite number", "e.g. 2")
        return None
    if value in (-1, 0):
        return None
    if value < 0:
        rec.reject(path, value, "must not be negative (-1 means unset)", "use a positive value or -1")
        return None
    if value > limit:
        rec.reject(
            path,
            value,
            f"{show(value)} is more than any node has (limit {limit})",
            "check the unit (memMB is in MiB, cpu in cores)",
        )
        return None
    return value


def resource_devices(rec: Recorder, path: str, res: Any) -> dict[str, int]:
    t = rec.target
    devices = res.devices if isinstance(res.devices, dict) else None
    if devices is None:
        raise rec.fail(f"{path}.devices", res.devices, "must be a dict", "{'vpc.amazonaws.com/efa': 1}")
    if not devices:
        rec.ok(f"{path}.devices", {}, "none")
    out: dict[str, int] = {}
    for dname, count in devices.items():
        dpath = f"{path}.devices[{dname!r}]"
        if not isinstance(dname, str) or not is_extended_resource(dname):
            rec.reject(
                dpath,
                dname,
                "an extended resource name looks like 'vendor.com/device'",
                "e.g. 'vpc.amazonaws.com/efa'",
            )
        elif not is_int(count) or not 0 <= count <= MAX_GPU:
            rec.reject(dpath, count, f"must be an integer in 0..{MAX_GPU}", "e.g. 1")
        elif t == "local":
            rec.ignore(
                dpath, count, "extended resources are node hardware; the local target uses what this machine has"
            )
        elif t == "kubernetes":
            rec.ok(dpath, count, f"extended resource {dname}: {count} (requests and limits)")
            if count:
                out[dname] = count
        else:
            rec.reject(
                dpath,
                count,
                "KFP v2 cannot request extended resources",
                "remove it, or run the role with target kubernetes",
            )
    return out


def resource_capabilities(rec: Recorder, path: str, res: Any) -> dict[str, str]:
    t = rec.target
    caps = res.capabilities if isinstance(res.capabilities, dict) else None
    if caps is None:
        raise rec.fail(
            f"{path}.capabilities",
            res.capabilities,
            "must be a dict",
            "{'node.kubernetes.io/instance-type': 'p4d.24xlarge'}",
        )
    if not caps:
        rec.ok(f"{path}.capabilities", {}, rec.on_target(BECOMES["no_capabilities"]))
    out: dict[str, str] = {}
    for key, value in caps.items():
        cpath = f"{path}.capabilities[{key!r}]"
        if key not in KNOWN_CAPABILITIES:
            rec.reject(
                cpath,
                value,
                f"unknown capability {key!r}",
                f"use a node label from: {', '.join(sorted(KNOWN_CAPABILITIES))}; or set "
                "role.metadata['kubernetes'] with a nodeSelector",
            )
        elif not isinstance(value, str) or len(value) > 63 or not is_label_value(value):
            rec.reject(
                cpath,
                value,
                "a node label value is a string of at most 63 characters [A-Za-z0-9._-]",
                "e.g. 'p4d.24xlarge'",
            )
        elif t == "local":
            rec.ignore(cpath, value, "node selection does not apply on one machine")
        else:
            rec.ok(cpath, value, rec.on_target(BECOMES["capability"], key=key, value=value))
            out[key] = value
    return out


def nightly_resource_fields(rec: Recorder, path: str, res: Any) -> None:
    """``Resource.tags`` exists in TorchX nightly only: read by name."""
    if not hasattr(res, "tags"):
        return
    tags = res.tags
    if tags:
        rec.ignore(f"{path}.tags", tags, "resource tags are informational for torchstep")
    else:
        rec.ok(f"{path}.tags", tags, "none")


# -- mounts -----------------------------------------------------------------------------
def role_mounts(rec: Recorder, p: str, role: Any) -> list[Mount]:
    """``roles[i].mounts``: each BindMount / VolumeMount / DeviceMount honoured or
    rejected per target (never silently skipped)."""
    mounts = getattr(role, "mounts", None)
    if not isinstance(mounts, list | tuple):
        raise rec.fail(f"{p}.mounts", mounts, "must be a list", "use torchx.specs.parse_mounts([...])")
    if not mounts:
        rec.ok(f"{p}.mounts", [], "no mounts")
    out: list[Mount] = []
    dsts: dict[str, int] = {}
    for j, m in enumerate(mounts):
        path = f"{p}.mounts[{j}]"
        try:
            mount = role_mount(rec, path, m, dsts)
        except Rejected:
            continue
        dsts[mount.dst] = j
        out.append(mount)
    return out


def role_mount(rec: Recorder, path: str, m: Any, dsts: dict[str, int]) -> Mount:
    from torchx.specs import BindMount, DeviceMount, VolumeMount

    if isinstance(m, BindMount):
        src, dst, ro, perms, kind = m.src_path, m.dst_path, m.read_only, None, "bind"
    elif isinstance(m, VolumeMount):
        src, dst, ro, perms, kind = m.src, m.dst_path, m.read_only, None, "volume"
    elif isinstance(m, DeviceMount):
        src, dst, perms, kind = m.src_path, m.dst_path, m.permissions, "device"
        if not isinstance(perms, str) or not perms or set(perms) - set("rwm"):
            raise rec.fail(
                f"{path}.permissions", perms, "device permissions are a non-empty subset of 'rwm'", "e.g. 'rwm'"
            )
        ro = "w" not in perms
    else:
        raise rec.fail(
            path,
            m,
            f"unknown mount type {type(m).__name__}",
            "use torchx.specs.BindMount, VolumeMount or DeviceMount (torchx.specs.parse_mounts)",
        )
    src_field = "src" if kind == "volume" else "src_path"
    if not isinstance(src, str) or not src or "\x00" in src:
        raise rec.fail(f"{path}.{src_field}", src, "the mount source must be a non-empty string", "fix the mount")
    if not isinstance(dst, str) or not dst.startswith("/") or "\x00" in dst:
        raise rec.fail(f"{path}.dst_path", dst, "the destination must be an absolute path", "e.g. /data")
    if not isinstance(ro, bool):
        raise rec.fail(f"{path}.read_only", ro, "must be True or False", "read_only=True")
    if dst in dsts:
        raise rec.fail(f"{path}.dst_path", dst, f"also the destination of mounts[{dsts[dst]}]", "mount each path once")
    mount = Mount(kind, src, dst, ro, perms)
    show_it = f"{kind} {src} -> {dst}" + (" ro" if ro else "")
    t = rec.target
    if kind == "volume" and t != "local" and not is_dns_subdomain(src):
        raise rec.fail(
            f"{path}.src",
            src,
            "a persistent volume claim name is a DNS-1123 subdomain",
            "use the claim's name, e.g. 'datasets'",
        )
    if kind != "volume" and not src.startswith("/") and t != "kfp":
        raise rec.fail(f"{path}.src_path", src, "a host path must be absolute", "use an absolute host path")
    if t == "local":
        rec.ok(path, show_it, local_mount(rec, mount, path))
    elif t == "kubernetes":
        ro_text = " (readOnly)" if ro else ""
        rec.ok(path, show_it, K8S_MOUNTS[kind].format(src=src, dst=dst, ro=ro_text, perms=perms))
    elif kind == "volume" and ro:
        raise rec.fail(
            f"{path}.read_only",
            show_it,
            "kfp.kubernetes.mount_pvc cannot mount a claim read-only",
            "set read_only=False, or run the role with target kubernetes",
        )
    elif kind == "volume":
        rec.ok(path, show_it, f"kfp.kubernetes.mount_pvc(pvc_name={src!r}, mount_path={dst!r})")
    else:
        raise rec.fail(
            path,
            show_it,
            f"KFP v2 has no {'hostPath' if kind == 'bind' else 'device'} mounts",
            "use a VolumeMount (PVC), or run the role with target kubernetes",
        )
    return mount


def local_mount(rec: Recorder, mount: Mount, path: str) -> str:
    if mount.kind == "volume":
        raise rec.fail(
            path,
            f"volume {mount.src} -> {mount.dst}",
            "a persistent volume claim does not exist on this machine",
            "use a BindMount for local runs, or run with target kubernetes",
        )
    what = "device" if mount.kind == "device" else "host path"
    if os.path.normpath(mount.dst) == "/" and os.path.normpath(mount.src) != "/":
        raise rec.fail(
            f"{path}.dst_path",
            mount.dst,
            f"mounting {mount.src} onto / would rewrite every absolute path in argv and env",
            "mount onto a subdirectory such as /data",
        )
    if mount.src == mount.dst:
        where = f"the {what} is used in place (same path on this machine)"
    else:
        where = f"{mount.dst} is rewritten to {mount.src} in argv and env (no container here)"
    return where + ("; read-only is not enforced (no container)" if mount.read_only else "")


# -- ports ------------------------------------------------------------------------------
def role_ports(rec: Recorder, p: str, role: Any) -> list[Port]:
    """``roles[i].port_map``: local free ports, Kubernetes container/Service ports, KFP
    only the rendezvous port."""
    pm = getattr(role, "port_map", None)
    t = rec.target
    if not isinstance(pm, dict):
        raise rec.fail(f"{p}.port_map", pm, "must be a dict of name to port", "{'c10d': 29500}")
    if not pm:
        rec.ok(f"{p}.port_map", {}, "no ports")
    out: list[Port] = []
    suffixes: dict[str, str] = {}
    numbers: dict[int, str] = {}
    for name, port in pm.items():
        path = f"{p}.port_map[{name!r}]"
        if not isinstance(name, str) or not name:
            rec.reject(path, name, "a port needs a name", "e.g. 'tensorboard'")
            continue
        if not is_int(port) or not 1 <= port <= 65535:
            rec.reject(path, port, "must be an integer in 1..65535", "e.g. 6006")
            continue
        if port in numbers:
            rec.reject(path, port, f"port {port} is also port_map[{numbers[port]!r}]", "use each port once")
            continue
        numbers[port] = name
        rdzv = name in RDZV_PORT_NAMES
        if t == "local":
            if rdzv:
                rec.ok(path, port, "the rendezvous port: replaced by the supervisor's store port")
                out.append(Port(name, port, rendezvous=True))
                continue
            suffix = env_suffix(name)
            if suffix in suffixes:
                rec.reject(
                    path,
                    port,
                    f"exported as {ENV_PORT_PREFIX}{suffix}, like port_map[{suffixes[suffix]!r}]",
                    "give the ports names that differ in letters or digits",
                )
                continue
            suffixes[suffix] = name
            rec.ok(
                path,
                port,
                f"port {port} + replica id on this machine, checked free at launch, "
                f"exported as {ENV_PORT_PREFIX}{suffix}",
            )
            out.append(Port(name, port, env=ENV_PORT_PREFIX + suffix))
            continue
        elif not is_port_name(name):
            rec.reject(
                path,
                port,
                f"{name!r} cannot name a Kubernetes port (at most 15 characters [a-z0-9-], with a letter)",
                "rename it, e.g. 'tb' or 'c10d'",
            )
            continue
        elif t == "kubernetes":
            rec.ok(path, port, f"containerPort {port} + headless Service port {name!r}")
        elif rdzv:
            rec.ok(path, port, "rendezvous port of the launcher-submitted job")
        else:
            rec.reject(path, port, "KFP v2 cannot expose ports", "remove it, or run the role with target kubernetes")
            continue
        out.append(Port(name, port, rendezvous=rdzv))
    return out
