"""Readiness of a multi-replica role's pods: Ready means *the gang formed*.

Kubernetes calls a pod Ready as soon as its container starts unless a readinessProbe says
otherwise, and Kueue's ``waitForPodsReady`` (all-or-nothing admission) trusts that: a Job
whose agents are still waiting in the rendezvous for a peer that cannot start would count as
running. So every pod of a multi-replica role gets

- ``TORCHSTEP_READY_FILE`` in its env: the agent writes that file once the rendezvous has
  formed the world and this node's workers started, and removes it while it restarts the
  group and when it exits (:mod:`torchstep.agent.readiness`);
- an exec ``readinessProbe`` that checks the file with the image's ``python`` (the
  interpreter the agent runs on: no ``test`` or shell binary needed; the command is a
  constant, never built from user data).

The file lives in ``/dev/shm``, the pod's own memory ``emptyDir`` (writable under a
read-only root filesystem); where a mount of the role's replaces ``/dev/shm`` (possibly a
host path that other pods share) it lives in ``/tmp``. A probe in the role's
``metadata["kubernetes"]`` overlay is kept instead of this one. A 1-replica role gets none: there is
no gang to form, and its pod is ready when its container runs.

Example::

    >>> spec = {"containers": [{"name": "main", "env": []}], "volumes": [{"name": "dshm", "emptyDir": {}}]}
    >>> add_readiness(spec)
    >>> spec["containers"][0]["env"]
    [{'name': 'TORCHSTEP_READY_FILE', 'value': '/dev/shm/torchstep-ready'}]
    >>> spec["containers"][0]["readinessProbe"]["exec"]["command"][-1]
    '/dev/shm/torchstep-ready'
"""

from __future__ import annotations

from typing import Any

from torchstep.contract import ENV_READY_FILE
from torchstep.kubernetes.pod import LAUNCH_COMMAND, SHM_VOLUME

__all__ = ["READY_FILE", "READY_FILE_FALLBACK", "add_readiness", "readiness_probe"]

#: Where the agent of a rendered multi-replica pod writes its readiness file.
READY_FILE = "/dev/shm/torchstep-ready"
#: ... where a mount of the role's replaces ``/dev/shm``.
READY_FILE_FALLBACK = "/tmp/torchstep-ready"
#: Seconds between probes; the pod turns Ready at most this long after the gang formed.
PERIOD_S = 2
#: A probe is an interpreter start: generous on a loaded node (a timeout counts as a failure).
TIMEOUT_S = 5
#: Failures in a row before a Ready pod turns unready (a group restart is shorter).
FAILURE_THRESHOLD = 3
_CHECK = "import os,sys; sys.exit(0 if os.path.isfile(sys.argv[1]) else 1)"


def readiness_probe(path: str) -> dict[str, Any]:
    """The exec readinessProbe that passes while the file at ``path`` exists.

    Args:
        path: the readiness file (``TORCHSTEP_READY_FILE``).

    Returns:
        The container's ``readinessProbe``.
    """
    # -I -S: no user site, no PYTHON* variables, no site import (a start of ~10 ms)
    return {
        "exec": {"command": [LAUNCH_COMMAND[0], "-I", "-S", "-c", _CHECK, path]},
        "periodSeconds": PERIOD_S,
        "timeoutSeconds": TIMEOUT_S,
        "successThreshold": 1,
        "failureThreshold": FAILURE_THRESHOLD,
    }


def add_readiness(spec: dict[str, Any]) -> None:
    """Give the agent's container of pod ``spec`` the readiness file and its probe (in place).

    Args:
        spec: a multi-replica role's pod spec as :func:`~torchstep.kubernetes.pod.pod_spec`
            renders it, the role's overlay applied (a probe there is kept).
    """
    ours = any(v.get("name") == SHM_VOLUME for v in spec.get("volumes") or [])
    path = READY_FILE if ours else READY_FILE_FALLBACK
    container = spec["containers"][0]
    env = container.setdefault("env", [])
    # with torchstep's own variables, before the secrets by reference (which come last)
    at = next((i for i, e in enumerate(env) if "secretKeyRef" in (e.get("valueFrom") or {})), len(env))
    env.insert(at, {"name": ENV_READY_FILE, "value": path})
    container.setdefault("readinessProbe", readiness_probe(path))  # the role's overlay may bring its own
