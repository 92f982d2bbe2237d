"""How one replica of a planned role is started — shared by every target.

The local supervisor, the Kubernetes renderer and the KFP adapter all start a replica the
same way: the embedded agent wraps the role's argv (or, when the role already runs its own
``torchrun``, the ``torchrun`` shim first on PATH turns it into our agent), with the same
per-replica environment. Only where the rendezvous lives differs per target.

Example::

    >>> import torchstep
    >>> from torchstep.plan.agent_command import agent_argv
    >>> plan = torchstep.build_plan(torchstep.materialize("utils.echo", ["--msg", "hi"]), "kubernetes")
    >>> agent_argv(plan.roles[0], rdzv_endpoint="echo-0.svc:29500", rdzv_id="echo-1a2b")[:3]
    ['torchstep-agent', '--nnodes', '1']

A role that runs its own torchrun starts as ``python -m torchstep.launch <argv>``
(:mod:`torchstep.launch`: the argv with the shim first on PATH).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchstep.contract import (
    ENV_APP_ID,
    ENV_GRACE_PERIOD,
    ENV_HANG_TIMEOUT,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_RDZV_CONF,
    ENV_RDZV_ENDPOINT,
    ENV_RDZV_ID,
    ENV_REPLICA_ID,
    ENV_ROLE,
)
from torchstep.plan.macros import RANK0_ENV_VAR
from torchstep.plan.model import RolePlan

#: The agent's console script (installed with ``pip install torchstep[agent]``).
AGENT = "torchstep-agent"
#: Default rendezvous port of the agent's c10d store (torchrun's default).
DEFAULT_RDZV_PORT = 29500


def macro_values(app_id: str, replica_id: int, *, img_root: str = "") -> dict[str, str]:
    """The values TorchX macros bind to for one replica.

    Args:
        app_id: the run's id (``${app_id}``).
        replica_id: the replica's index in its role (``${replica_id}``).
        img_root: the image's root directory (``${img_root}``); empty on every target here.

    Returns:
        Macro name → value (``rank0_env`` names the variable that holds replica 0's host).
    """
    return {
        "app_id": app_id,
        "replica_id": str(replica_id),
        "img_root": img_root,
        "base_img_root": img_root,
        "rank0_env": RANK0_ENV_VAR,
    }


def agent_argv(
    role: RolePlan,
    *,
    rdzv_endpoint: str,
    rdzv_id: str | None,
    rdzv_backend: str = "c10d",
    agent: Sequence[str] = (AGENT,),
    replica_args: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv that starts one replica of ``role`` (macros in the role's args are bound
    with ``replica_args`` when given — see :func:`macro_values`).

    A role that runs its own torchrun keeps its argv unchanged: the shim (first on PATH)
    makes that torchrun our agent, and the launcher's rendezvous reaches it through the
    ``TORCHSTEP_RDZV_*`` environment (see :func:`replica_env`).

    Args:
        role: the role's plan.
        rdzv_endpoint: ``host:port`` of the rendezvous.
        rdzv_id: the rendezvous id, the same for every replica of one run; ``None``: not on
            the command line (which every local user can read in /proc) — the caller sets it
            in the environment (``TORCHSTEP_RDZV_ID``, see :func:`replica_env`) instead.
        rdzv_backend: torch's rendezvous backend.
        agent: the command that starts the agent.
        replica_args: macro values to bind the role's args with; ``None``: leave them unbound.
        extra: more agent flags, before the role's argv.

    Returns:
        The argv.
    """
    argv = role.bind(replica_args)[0] if replica_args is not None else role.argv
    if role.uses_torchrun:
        return argv
    flags = [
        *agent,
        "--nnodes",
        role.nnodes,
        "--nproc-per-node",
        str(role.nproc_per_node),
        "--role",
        role.name,
        "--max-restarts",
        str(role.retry.agent_restarts),
        "--rdzv-backend",
        rdzv_backend,
        "--rdzv-endpoint",
        rdzv_endpoint,
    ]
    if rdzv_id is not None:
        flags += ["--rdzv-id", rdzv_id]
    if role.heartbeat_timeout_s is not None:
        flags += ["--heartbeat-timeout", f"{role.heartbeat_timeout_s:g}"]
    if role.hang_timeout_s is not None:
        flags += ["--hang-timeout", f"{role.hang_timeout_s:g}"]
    if role.grace_period_s is not None:
        flags += ["--grace-period", f"{role.grace_period_s:g}"]
    return [*flags, *extra, "--no-python", *argv]


def replica_env(
    role: RolePlan,
    *,
    app_id: str,
    replica_id: int,
    rank0_host: str,
    rdzv_endpoint: str | None = None,
    rdzv_id: str | None = None,
    rdzv_conf: str | None = None,
    img_root: str = "",
) -> dict[str, str]:
    """The role's env (macros bound) plus what torchstep sets for every replica.

    Args:
        role: the role's plan.
        app_id: the run's id.
        replica_id: the replica's index in its role.
        rank0_host: replica 0's host (``TORCHX_RANK0_HOST``).
        rdzv_endpoint: ``host:port`` of the rendezvous, for a role's own torchrun; ``None``: unset.
        rdzv_id: the rendezvous id (read by the agent whatever starts it); ``None``: unset.
        rdzv_conf: the agent's ``--rdzv-conf``, likewise; ``None``: unset.
        img_root: the ``${img_root}`` macro's value.

    Returns:
        The replica's environment (only what the plan sets, not the caller's).
    """
    env = role.bind(macro_values(app_id, replica_id, img_root=img_root))[1]
    env.update(
        {
            ENV_APP_ID: app_id,
            ENV_ROLE: role.name,
            ENV_REPLICA_ID: str(replica_id),
            RANK0_ENV_VAR: rank0_host,
            # pytorch#135712: a restarted gloo group must not read the previous attempt's
            # connection data from the shared rendezvous store.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
    )
    if role.uses_torchrun:
        # The role's own torchrun keeps its argv (the shim makes it our agent): what
        # agent_argv would pass as flags reaches it through the environment instead —
        # torchrun reads PET_*, the agent TORCHSTEP_*; a flag in the command wins (the
        # planner rejects a flag that disagrees with the plan).
        if role.retry.agent_restarts and "PET_MAX_RESTARTS" not in role.env:
            env["PET_MAX_RESTARTS"] = str(role.retry.agent_restarts)
        if "PET_NPROC_PER_NODE" not in role.env:
            env["PET_NPROC_PER_NODE"] = str(role.nproc_per_node)
        if role.heartbeat_timeout_s is not None:
            env[ENV_HEARTBEAT_TIMEOUT] = f"{role.heartbeat_timeout_s:g}"
        if role.hang_timeout_s is not None:
            env[ENV_HANG_TIMEOUT] = f"{role.hang_timeout_s:g}"
        if role.grace_period_s is not None:
            env[ENV_GRACE_PERIOD] = f"{role.grace_period_s:g}"
    if rdzv_endpoint is not None:
        env[ENV_RDZV_ENDPOINT] = rdzv_endpoint
    if rdzv_id is not None:
        env[ENV_RDZV_ID] = rdzv_id
    if rdzv_conf:
        env[ENV_RDZV_CONF] = rdzv_conf
    return env
