"""Resources on one machine: GPUs are partitioned across replicas (``CUDA_VISIBLE_DEVICES``),
CPUs too (affinity + ``OMP_NUM_THREADS``), declared ports are checked free; ``memMB`` is
advisory (``explain`` says so).

Example::

    >>> from torchstep.local.resources import split
    >>> split([2, 2], ["0", "1", "2", "3"])
    [('0', '1'), ('2', '3')]
"""

from __future__ import annotations

import errno
import math
import os
import socket
from collections.abc import Mapping, Sequence

from torchstep.errors import SpecError
from torchstep.plan.model import RolePlan

TARGET = "local"


def detect_gpus(env: Mapping[str, str] | None = None) -> list[str]:
    """GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else one id per GPU
    the NVIDIA driver lists in ``/proc/driver/nvidia/gpus`` (no torch import, no CUDA init).

    Args:
        env: the environment to read ``CUDA_VISIBLE_DEVICES`` from; ``None``: ``os.environ``.

    Returns:
        The GPU ids (empty when there is none).
    """
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d.strip() for d in visible.split(",") if d.strip()]
        # CUDA stops at the first invalid id ("-1" is the usual "no GPU")
        out = []
        for d in ids:
            if d.startswith("-"):
                break
            out.append(d)
        return out
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def split(counts: Sequence[int], available: Sequence[str]) -> list[tuple[str, ...]]:
    """Disjoint consecutive slices of ``available``, one of ``counts[i]`` items per replica.
    The caller checks ``sum(counts) <= len(available)``.

    Args:
        counts: items per replica.
        available: the items to share out, in order.

    Returns:
        One slice per count.
    """
    out, pos = [], 0
    for n in counts:
        out.append(tuple(available[pos : pos + n]))
        pos += n
    return out


def gpu_slices(roles: Sequence[RolePlan], available: Sequence[str]) -> dict[tuple[str, int], tuple[str, ...]]:
    """``(role, replica) -> GPU ids`` for every replica that asks for GPUs.

    Args:
        roles: the plan's roles.
        available: the GPU ids the run may use.

    Raises:
        SpecError: the replicas ask for more GPUs than there are.

    >>> import torchstep
    >>> from torchx import specs
    >>> app = specs.AppDef("a", roles=[specs.Role("r", image="x", entrypoint="python", num_replicas=2,
    ...                                           resource=specs.Resource(cpu=1, gpu=2, memMB=64))])
    >>> gpu_slices(torchstep.build_plan(app, "local").roles, ["0", "1", "2", "3"])
    {('r', 0): ('0', '1'), ('r', 1): ('2', '3')}
    >>> gpu_slices(torchstep.build_plan(app, "local").roles, ["0"])
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: roles[0].resource.gpu (target 'local'): ...
    """
    keys: list[tuple[str, int]] = []
    counts: list[int] = []
    total = 0
    for i, role in enumerate(roles):
        g = role.resources.gpu
        if not g:
            continue
        total += g * role.num_replicas
        if total > len(available):
            have = f"{len(available)} GPU(s) ({','.join(available)})" if available else "no GPU"
            raise SpecError(
                f"roles[{i}].resource.gpu",
                TARGET,
                f"role {role.name!r} asks for {g} GPU(s) x {role.num_replicas} replica(s), {total} in all with "
                f"the roles before it, and this machine has {have}",
                fix="lower resource.gpu or num_replicas, pass cfg gpus=<ids>, or run on a target with GPUs",
            )
        for r in range(role.num_replicas):
            keys.append((role.name, r))
            counts.append(g)
    return dict(zip(keys, split(counts, available), strict=True))


def cpu_slices(roles: Sequence[RolePlan], cores: Sequence[int]) -> tuple[dict[tuple[str, int], tuple[int, ...]], bool]:
    """``(role, replica) -> cores`` for every replica with ``resource.cpu`` set, and whether
    the machine is oversubscribed (then slices wrap around and overlap: a TorchX default
    such as ``dist.ddp``'s 2 CPUs per replica must still run on a 2-core machine).

    Args:
        roles: the plan's roles.
        cores: the cores the run may use.

    >>> from torchstep.local.resources import cpu_slices
    >>> import torchstep
    >>> from torchx import specs
    >>> app = specs.AppDef("a", roles=[specs.Role("r", image="x", entrypoint="python", num_replicas=2,
    ...                                           resource=specs.Resource(cpu=1, gpu=0, memMB=64))])
    >>> cpu_slices(torchstep.build_plan(app, "local").roles, [0, 1, 2, 3])
    ({('r', 0): (0,), ('r', 1): (1,)}, False)
    """
    out: dict[tuple[str, int], tuple[int, ...]] = {}
    cores = sorted(cores)
    if not cores:
        return out, False
    pos, need = 0, 0
    for role in roles:
        cpu = role.resources.cpu
        if not cpu:
            continue
        n = min(max(1, math.ceil(cpu)), len(cores))
        for r in range(role.num_replicas):
            out[(role.name, r)] = tuple(sorted(cores[(pos + k) % len(cores)] for k in range(n)))
            pos += n
            need += n
    return out, need > len(cores)


def usable_cores() -> list[int]:
    """The cores this process may run on (its own affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return list(range(os.cpu_count() or 1))


def role_ports(roles: Sequence[RolePlan]) -> dict[tuple[str, int], dict[str, str]]:
    """``(role, replica) -> {TORCHSTEP_PORT_<NAME>: port}``: replica ``r`` of a role gets
    ``port + r`` for each non-rendezvous ``port_map`` entry (replicas share one host). Every
    port is checked free now, so a taken port is a SpecError before any process starts.
    The rendezvous port (``c10d``...) is ignored: the supervisor picks a free one.

    Args:
        roles: the plan's roles.

    Returns:
        The port variables of every replica.

    Raises:
        SpecError: a port is taken or cannot be bound, beyond 65535, or two replicas would share one.
    """
    out: dict[tuple[str, int], dict[str, str]] = {}
    claimed: dict[int, str] = {}
    for i, role in enumerate(roles):
        for port in role.ports:
            if port.rendezvous or port.env is None:
                continue
            field = f"roles[{i}].port_map[{port.name!r}]"
            for r in range(role.num_replicas):
                p = port.port + r
                who = f"{role.name} replica {r}"
                if p > 65535:
                    raise SpecError(
                        field,
                        TARGET,
                        f"replica {r} would get port {p} (port + replica id), beyond 65535",
                        fix="choose a lower port",
                    )
                if p in claimed:
                    raise SpecError(
                        field,
                        TARGET,
                        f"port {p} of {who} is also the port of {claimed[p]} (replicas get port + replica id)",
                        fix="space the ports of the roles apart",
                    )
                problem = port_problem(p)
                if problem:
                    raise SpecError(
                        field,
                        TARGET,
                        f"port {p} (for {who}) {problem}",
                        fix="stop what holds it, or choose another port in port_map",
                    )
                claimed[p] = who
                out.setdefault((role.name, r), {})[port.env] = str(p)
    return out


def port_problem(port: int) -> str | None:
    """Why ``port`` cannot be listened on here, or None when it is free.

    Args:
        port: the TCP port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR: a port left in TIME_WAIT is free for a listener; a listener is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return "is already in use on this machine"
            return f"cannot be bound: {e.strerror}"
    return None
