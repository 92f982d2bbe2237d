"""What one pod that runs a whole step needs: the step runs on the ``local`` target inside a
pod an orchestrator makes (a Prefect flow-run pod, a worker pod), so that pod asks for every
replica's cpu, memory and GPUs (summed) and carries the roles' volumes, node selectors,
tolerations, env and Secret references — by torchstep's own Kubernetes rules
(:mod:`torchstep.kubernetes.pod`), as the ``kubernetes`` target would render them.

Example::

    >>> import torchstep
    >>> from torchx import specs
    >>> role = specs.Role("t", image="img:1", entrypoint="python", num_replicas=2,
    ...                   resource=specs.Resource(cpu=4, gpu=1, memMB=8192))
    >>> pod = host_pod(torchstep.build_plan(specs.AppDef("a", roles=[role]), "kubernetes"))
    >>> pod.images, pod.cpu, pod.mem_mb, pod.gpu
    (('img:1',), 8, 16384, 2)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torchstep.plan.model import StepPlan

__all__ = ["HostPod", "host_pod"]


@dataclass(frozen=True)
class HostPod:
    """What the pod hosting a whole step needs (Kubernetes objects as plain dicts).

    Args:
        images: the roles' images, in order, each once.
        cpu: CPU cores summed over every replica of every role.
        mem_mb: memory in MiB summed likewise.
        gpu: GPUs summed likewise.
        volumes: the pod's volumes.
        volume_mounts: the container's volume mounts.
        node_selector: the roles' node selectors, merged.
        tolerations: the roles' tolerations.
        env: plain environment variables.
        secret_env: container env entries with ``valueFrom.secretKeyRef``.
    """

    images: tuple[str, ...]
    cpu: float = 0.0
    mem_mb: int = 0
    gpu: int = 0
    volumes: list[dict[str, Any]] = field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = field(default_factory=list)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Any] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: Container env entries with ``valueFrom.secretKeyRef``.
    secret_env: list[dict[str, Any]] = field(default_factory=list)


def host_pod(plan: StepPlan) -> HostPod:
    """What one pod running every replica of ``plan`` needs (see the module docstring).

    Args:
        plan: the step's plan for target ``kubernetes`` (its rules decide volumes and the
            pod overlay's node selector and tolerations).

    Returns:
        The images of the roles (in order, each once) and the summed resources, volumes,
        node selectors, tolerations, env and Secret env of every role.
    """
    from torchstep.kubernetes.options import resolve
    from torchstep.kubernetes.pod import volumes

    opts = resolve({})
    vols: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    selector: dict[str, str] = {}
    tolerations: list[Any] = []
    env: dict[str, str] = {}
    secret_env: list[dict[str, Any]] = []
    for r in plan.roles:
        v, m, _ = volumes(r, opts)
        vols += [x for x in v if x not in vols]
        mounts += [x for x in m if x not in mounts]
        selector.update({k: str(val) for k, val in r.resources.capabilities.items()})
        overlay = r.metadata.get("kubernetes") or {}
        spec = overlay.get("spec", overlay) if isinstance(overlay, dict) else {}
        selector.update(spec.get("nodeSelector") or {})
        tolerations += [t for t in spec.get("tolerations") or [] if t not in tolerations]
        env.update(r.env)
        secret_env += [
            {"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in r.secret_env
        ]
    return HostPod(
        images=tuple(dict.fromkeys(r.image for r in plan.roles)),
        cpu=sum((r.resources.cpu or 0) * r.num_replicas for r in plan.roles),
        mem_mb=sum((r.resources.mem_mb or 0) * r.num_replicas for r in plan.roles),
        gpu=int(sum((r.resources.gpu or 0) * r.num_replicas for r in plan.roles)),
        volumes=vols,
        volume_mounts=mounts,
        node_selector=selector,
        tolerations=tolerations,
        env=env,
        secret_env=secret_env,
    )
