"""One role's pod: the container (agent command, env, ports, resources, mounts) and the
pod spec around it. Plain dicts, ready for a Pod, a Job template or KubernetesPodOperator.

Kubernetes expands ``$(VAR)`` in ``command``, ``args`` and env values and turns ``$$``
into ``$``. Every ``$`` that comes from the AppDef is therefore written as ``$$``, so the
role's argv reaches the container byte for byte (after TorchX's own macro binding); the
only reference left unescaped is ``$(TORCHSTEP_REPLICA_ID)``, which binds ``${replica_id}``
per pod.

Example::

    >>> escape("echo $HOME $(id) $$")
    'echo $$HOME $$(id) $$$$'
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from torchstep.contract import ENV_REPLICA_ID, ENV_RESULT_FILE, ENV_TERMINATION_LOG
from torchstep.errors import SpecError
from torchstep.kubernetes.options import KubernetesOptions
from torchstep.plan.agent_command import agent_argv, macro_values, replica_env
from torchstep.plan.model import RolePlan
from torchstep.result import TERMINATION_LOG

TARGET = "kubernetes"
#: Name of the agent's container in every rendered pod (KubernetesPodOperator: pass it as
#: ``base_container_name``).
CONTAINER_NAME = "main"
#: The container command of a role that runs its own torchrun: puts the ``torchrun`` shim
#: first on PATH, then execs the role's argv.
LAUNCH_COMMAND = ("python", "-m", "torchstep.launch")
#: Where an Indexed Job pod reads its index (the replica id) through the downward API.
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
SHM_VOLUME = "dshm"
GPU_RESOURCE = "nvidia.com/gpu"
#: Seconds Kubernetes waits after the agent's own grace period before SIGKILL (result file, logs).
GRACE_MARGIN_S = 15

# ${replica_id} while binding; becomes $(TORCHSTEP_REPLICA_ID) after escaping. A NUL byte
# cannot occur in planned args or env, so it never collides with AppDef text.
_REPLICA_SENTINEL = "\x00replica_id\x00"


@dataclass(frozen=True)
class Endpoint:
    """Where one role's replicas meet: its app id, rendezvous id and replica 0's host.

    >>> Endpoint("echo-1a2b3c4d", "echo-echo-1a2b3c4d", "localhost", 29500, indexed=False).rdzv_endpoint
    'localhost:29500'

    Args:
        app_id: the run's id.
        rdzv_id: the rendezvous id (the role's object name).
        rank0_host: replica 0's host (its FQDN, or ``localhost`` for one replica).
        rdzv_port: the rendezvous port.
        indexed: whether the replica id comes from the Job completion index (else always 0).
    """

    app_id: str
    rdzv_id: str
    rank0_host: str
    rdzv_port: int
    indexed: bool  # replica id from the Job completion index (else always 0)

    @property
    def rdzv_endpoint(self) -> str:
        """``host:port`` of the c10d rendezvous."""
        return f"{self.rank0_host}:{self.rdzv_port}"


def escape(text: str) -> str:
    """``text`` protected from Kubernetes' ``$(VAR)`` expansion (``$`` → ``$$``), with the
    replica id placeholder turned into ``$(TORCHSTEP_REPLICA_ID)``.

    Args:
        text: an arg or env value, macros bound.

    Returns:
        The escaped text.
    """
    return text.replace("$", "$$").replace(_REPLICA_SENTINEL, f"$({ENV_REPLICA_ID})")


def command_and_args(role: RolePlan, ep: Endpoint, opts: KubernetesOptions) -> tuple[list[str], list[str]]:
    """The container's ``command`` and ``args``: the agent wrapping the role's argv, or the
    launcher running the role's own torchrun (its shim execs the agent, which reads the
    rendezvous from ``TORCHSTEP_RDZV_*``).

    Args:
        role: the role's plan.
        ep: where the role's replicas meet.
        opts: the resolved run options.

    Returns:
        ``(command, args)``.
    """
    argv = agent_argv(
        role,
        rdzv_endpoint=ep.rdzv_endpoint,
        rdzv_id=ep.rdzv_id,
        replica_args=_macro_values(ep),
        extra=["--rdzv-conf", rdzv_conf(opts, role, ep)],
    )
    command, args = (list(LAUNCH_COMMAND), argv) if role.uses_torchrun else (argv[:1], argv[1:])
    return command, [escape(a) for a in args]


def _macro_values(ep: Endpoint) -> dict[str, str]:
    return {**macro_values(ep.app_id, 0), "replica_id": _REPLICA_SENTINEL if ep.indexed else "0"}


def rdzv_conf(opts: KubernetesOptions, role: RolePlan | None = None, ep: Endpoint | None = None) -> str:
    """The agent's ``--rdzv-conf`` on Kubernetes: the join timeout, and with the
    ``store_takeover`` option (an elastic multi-replica role) the store's move to a survivor,
    with the other replicas' FQDNs as the places a late agent looks for it, and the run's
    Lease as the witness of an even split.

    Args:
        opts: the resolved run options.
        role: the role (its ``--nnodes``); ``None``: no move.
        ep: where its replicas meet (replica 0's FQDN); ``None``: no move.

    Returns:
        ``key=value`` pairs, comma-separated.

    >>> rdzv_conf(KubernetesOptions())
    'join_timeout=900'
    """
    conf = f"join_timeout={opts.join_timeout}"
    if not (opts.store_takeover and role is not None and ep is not None and ep.indexed):
        return conf
    low, _, high = role.nnodes.partition(":")
    if not high or low == high:
        return conf  # a fixed size fails fast instead (docs/agent.md)
    first, _, domain = ep.rank0_host.partition(".")  # <job>-0.<job>.<ns>.svc.<domain>
    job = first.removesuffix("-0")
    hosts = "|".join(f"{job}-{i}.{domain}" for i in range(1, role.num_replicas))
    conf = f"{conf},store_takeover=on,store_candidates={hosts}"
    # the Lease that breaks an even split (two replicas, one cut off): torchstep.agent.witness
    return f"{conf},store_witness=kubernetes" if opts.store_witness else conf


def container_env(role: RolePlan, ep: Endpoint, opts: KubernetesOptions, role_path: str) -> list[dict[str, Any]]:
    """The container's env: the replica id first (env values may reference it), then the
    role's env and torchstep's per-replica variables, then secrets by reference.

    Args:
        role: the role's plan.
        ep: where the role's replicas meet.
        opts: the resolved run options.
        role_path: the role's field path (``roles[0]``) for errors.

    Returns:
        The container's ``env`` entries.

    Raises:
        SpecError: a ``secret_env`` variable torchstep sets itself.
    """
    kwargs: dict[str, Any] = {
        "app_id": ep.app_id,
        "replica_id": 0,
        "rank0_host": ep.rank0_host,
        "rdzv_endpoint": ep.rdzv_endpoint,
        "rdzv_id": ep.rdzv_id,
        "rdzv_conf": rdzv_conf(opts, role, ep),
    }
    env = replica_env(role, **kwargs)
    # replica_env binds ${replica_id} for one known replica; a Job's pods learn theirs at
    # run time, so rebind the role's own variables (not torchstep's) with the placeholder.
    ours = replica_env(dataclasses.replace(role, env={}), **kwargs)
    env.update({k: v for k, v in role.bind(_macro_values(ep))[1].items() if k not in ours})
    env.pop(ENV_REPLICA_ID, None)
    if opts.result_file:
        env[ENV_RESULT_FILE] = opts.result_file
    # the agent's final result summary becomes the container's termination message
    env[ENV_TERMINATION_LOG] = TERMINATION_LOG
    first: dict[str, Any] = (
        {"name": ENV_REPLICA_ID, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}}
        if ep.indexed
        else {"name": ENV_REPLICA_ID, "value": "0"}
    )
    items = [first, *({"name": k, "value": escape(v)} for k, v in env.items())]
    for ref in role.secret_env:
        if ref.env in env or ref.env == ENV_REPLICA_ID:
            raise SpecError(
                f"{role_path}.metadata['torchstep']['secret_env'][{ref.env!r}]",
                TARGET,
                f"{ref.env} is set by torchstep for every replica",
                fix="read the secret into another variable name",
            )
        items.append({"name": ref.env, "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}})
    return items


def container_ports(role: RolePlan, ep: Endpoint) -> list[dict[str, Any]]:
    """``containerPort`` per ``port_map`` entry, plus the rendezvous port of a
    multi-replica role when the role does not declare it.

    Args:
        role: the role's plan.
        ep: where the role's replicas meet.

    Returns:
        The container's ``ports`` entries.
    """
    ports = [{"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in role.ports]
    if ep.indexed and ep.rdzv_port not in {p.port for p in role.ports}:
        ports.append({"name": "c10d", "containerPort": ep.rdzv_port, "protocol": "TCP"})
    return ports


def resources(role: RolePlan, role_path: str) -> dict[str, Any]:
    """requests = limits (Guaranteed QoS when cpu and memMB are both set): cpu in cores or
    millicores, memMB as ``Mi``, gpu as ``nvidia.com/gpu``, devices as extended resources.

    Args:
        role: the role's plan.
        role_path: the role's field path (``roles[0]``) for errors.

    Returns:
        The container's ``resources`` (empty when none is set).

    Raises:
        SpecError: GPUs requested both as ``resource.gpu`` and as a device.
    """
    res = role.resources
    amounts: dict[str, str] = {}
    if res.cpu is not None:
        milli = math.ceil(res.cpu * 1000 - 1e-6)
        amounts["cpu"] = str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"
    if res.mem_mb is not None:
        amounts["memory"] = f"{res.mem_mb}Mi"
    if res.gpu:
        amounts[GPU_RESOURCE] = str(res.gpu)
    for name, count in res.devices.items():
        if name == GPU_RESOURCE and res.gpu:
            raise SpecError(
                f"{role_path}.resource.devices[{name!r}]",
                TARGET,
                f"{GPU_RESOURCE} is also requested by resource.gpu",
                fix="request GPUs in one place (resource.gpu)",
            )
        if count:
            amounts[name] = str(count)
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def volumes(role: RolePlan, opts: KubernetesOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """(pod volumes, container volumeMounts, privileged). ``/dev/shm`` is a memory
    ``emptyDir`` (PyTorch DataLoader workers need more than the runtime's 64 MiB) unless a
    mount targets it; devices need a privileged container for device cgroup access.

    Args:
        role: the role's plan.
        opts: the resolved run options.

    Returns:
        ``(volumes, volume_mounts, privileged)``.
    """
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if not any(m.dst == "/dev/shm" for m in role.mounts):
        shm: dict[str, Any] = {"medium": "Memory"}
        if opts.shm_size:
            shm["sizeLimit"] = opts.shm_size
        vols.append({"name": SHM_VOLUME, "emptyDir": shm})
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    ro = {"readOnly": True}
    for j, m in enumerate(role.mounts):
        name = f"mount-{j}"
        if m.kind == "volume":
            vols.append({"name": name, "persistentVolumeClaim": {"claimName": m.src, **(ro if m.read_only else {})}})
        else:  # bind and device: a host path
            vols.append({"name": name, "hostPath": {"path": m.src}})
        mounts.append({"name": name, "mountPath": m.dst, **(ro if m.read_only else {})})
    return vols, mounts, any(m.kind == "device" for m in role.mounts)


def pod_spec(
    role: RolePlan, ep: Endpoint, opts: KubernetesOptions, *, role_path: str, subdomain: str | None
) -> dict[str, Any]:
    """The pod spec of one replica of ``role`` (before the role's overlay).

    Args:
        role: the role's plan.
        ep: where the role's replicas meet.
        opts: the resolved run options.
        role_path: the role's field path (``roles[0]``) for errors.
        subdomain: the headless Service's name (replicas' DNS names); ``None``: no Service.

    Returns:
        The pod's ``spec``.
    """
    command, args = command_and_args(role, ep, opts)
    vols, mounts, privileged = volumes(role, opts)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": role.image,
        "command": command,
        "args": args,
        "env": container_env(role, ep, opts, role_path),
        "volumeMounts": mounts,
        # `kubectl describe pod` shows the log tail when the agent exits non-zero
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    ports = container_ports(role, ep)
    if ports:
        container["ports"] = ports
    res = resources(role, role_path)
    if res:
        container["resources"] = res
    if privileged:
        container["securityContext"] = {"privileged": True}
    if opts.image_pull_policy:
        container["imagePullPolicy"] = opts.image_pull_policy
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # no <SERVICE>_PORT variables for every Service of the namespace in the workers' env
        "enableServiceLinks": False,
        "containers": [container],
        "volumes": vols,
    }
    _set(spec, "nodeSelector", {k: str(v) for k, v in role.resources.capabilities.items()} or None)
    _set(spec, "subdomain", subdomain)
    _set(spec, "serviceAccountName", opts.service_account)
    _set(spec, "priorityClassName", opts.priority_class)
    _set(spec, "imagePullSecrets", [{"name": n} for n in opts.image_pull_secrets] or None)
    if role.grace_period_s is not None:
        spec["terminationGracePeriodSeconds"] = math.ceil(role.grace_period_s) + GRACE_MARGIN_S
    return spec


def _set(target: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        target[key] = value
