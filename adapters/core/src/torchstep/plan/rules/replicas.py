"""Rules for how many processes a role runs and how the agent starts them:
``Role.num_replicas`` / ``min_replicas``, ``metadata["torchstep"]["nproc_per_node"]`` and
the agent options, and a role's own torchrun (whose flags must agree with the plan).
Part of the rule book behind :func:`torchstep.build_plan`.

Example::

    >>> from torchx.specs import Role
    >>> rec = Recorder(app=None, target="kubernetes")
    >>> role_replicas(rec, "roles[0]", Role("t", image="img", num_replicas=4, min_replicas=2))
    (2, 4)
    >>> rec.decisions[0].becomes
    'Indexed Job, parallelism = completions = 4, agent --nnodes 2:4'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchstep.plan.cmdline import TorchrunCall, positive_int
from torchstep.plan.limits import MAX_NPROC, MAX_REPLICAS
from torchstep.plan.rules.metadata import agent_options
from torchstep.plan.rules.record import Recorder, Wording, is_int

#: What num_replicas becomes on each target, for one replica and for several.
BECOMES: dict[str, Wording] = {
    "one_replica": {
        "local": "1 agent process(es), --nnodes 1",
        "kubernetes": "one Pod, agent --nnodes 1",
        "kfp": "one container task, agent --nnodes 1",
    },
    "replicas": {
        "local": "{num} agent process(es), --nnodes {nnodes}",
        "kubernetes": "Indexed Job, parallelism = completions = {num}, agent --nnodes {nnodes}",
        "kfp": "launcher step submitting an Indexed Job of {num}, agent --nnodes {nnodes}",
    },
}


def role_replicas(rec: Recorder, p: str, role: Any) -> tuple[int, int]:
    num = role.num_replicas
    if not is_int(num) or not 1 <= num <= MAX_REPLICAS:
        raise rec.fail(f"{p}.num_replicas", num, f"must be an integer in 1..{MAX_REPLICAS}", "set Role(num_replicas=N)")
    mn = role.min_replicas
    if mn is None:
        mn = num
    elif not is_int(mn) or not 1 <= mn <= num:
        raise rec.fail(
            f"{p}.min_replicas",
            mn,
            f"must be an integer in 1..num_replicas ({num})",
            "set min_replicas <= num_replicas, or leave it unset",
        )
    nnodes = f"{mn}:{num}" if mn != num else str(num)
    wording = BECOMES["replicas" if num > 1 else "one_replica"]
    rec.ok(f"{p}.num_replicas", num, rec.on_target(wording, num=num, nnodes=nnodes))
    if role.min_replicas is None:
        rec.ok(f"{p}.min_replicas", None, f"unset: = num_replicas ({num}), not elastic")
    else:
        rec.ok(f"{p}.min_replicas", mn, "elastic minimum: the agent's rendezvous starts with at least this many")
    return mn, num


def role_launch(
    rec: Recorder, p: str, entrypoint: str, opts: Mapping[str, Any], call: TorchrunCall | None, num: int, mn: int
) -> int:
    """Worker processes per replica, and how the agent starts the role."""
    opath = f"{p}.metadata['torchstep']"
    if call is None:
        n = int(opts.get("nproc_per_node", 1))
        if "nproc_per_node" in opts:
            rec.ok(f"{opath}['nproc_per_node']", n, f"agent --nproc-per-node {n}")
        agent_options(rec, p, opts, own_torchrun=False)
        rec.ok(
            f"{p}.entrypoint+args",
            entrypoint,
            f"wrapped: torchstep-agent --nproc-per-node {n} --no-python <entrypoint> <args>",
        )
        return n
    detected = positive_int(call.nproc_per_node, MAX_NPROC)
    n = detected or 1
    if "nproc_per_node" in opts:
        want = opts["nproc_per_node"]
        if call.nproc_per_node is None:
            n = want
            rec.ok(
                f"{opath}['nproc_per_node']",
                want,
                f"PET_NPROC_PER_NODE={want} for the role's own torchrun (its command sets none)",
            )
        elif want != detected:
            rec.reject(
                f"{opath}['nproc_per_node']",
                want,
                f"the role runs its own torchrun, whose --nproc-per-node {call.nproc_per_node} decides",
                "set it in one place: the torchrun command, or this option with no flag in the command",
            )
        else:
            rec.ok(f"{opath}['nproc_per_node']", want, "the same as the role's torchrun --nproc-per-node")
    expected = {str(num), f"{mn}:{num}"}
    replicas_ok = not (rec.rejected_under(f"{p}.num_replicas") or rec.rejected_under(f"{p}.min_replicas"))
    if replicas_ok and call.nnodes is not None and "$" not in call.nnodes and call.nnodes not in expected:
        rec.reject(
            f"{p}.args",
            f"--nnodes {call.nnodes}",
            f"the role's torchrun waits for --nnodes {call.nnodes} but the role has "
            f"{mn if mn == num else f'{mn}..{num}'} replica(s): the rendezvous would never complete",
            f"use --nnodes {mn if mn == num else f'{mn}:{num}'}, or change num_replicas/min_replicas",
        )
    agent_options(rec, p, opts, own_torchrun=True)
    how = (
        f"torchrun's --nproc-per-node {call.nproc_per_node}"
        if call.nproc_per_node and not detected
        else f"{n} process(es) per replica"
    )
    rec.ok(
        f"{p}.entrypoint+args",
        "torchrun",
        f"the role's own torchrun runs as torchstep-agent (shim first on PATH), {how}",
    )
    return n
