"""Everything about a local run that can be decided — and refused — before any process
starts: mounts, GPU and CPU partitions, declared ports, per-replica environment, working
directory and log paths.

Example::

    >>> import torchstep
    >>> from torchstep.local.options import resolve
    >>> from torchstep.local.prepare import prepare
    >>> plan = torchstep.build_plan(torchstep.materialize("utils.echo", ["--msg", "hi"]), "local")
    >>> [(r.role.name, r.replica_id) for r in prepare(plan, resolve({}), app_id="echo-1a2b").replicas]
    [('echo', 0)]
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from torchstep import contract
from torchstep.errors import SpecError
from torchstep.local import mounts, resources
from torchstep.local.options import LocalOptions
from torchstep.plan import agent_command
from torchstep.plan.model import RolePlan, StepPlan

#: The rank-0 host of every role on this machine.
LOCALHOST = "127.0.0.1"
#: What a step that does not inherit this process's environment (``inherit_env=False``)
#: still gets from it: what every program expects, the GPUs this process may use (a
#: restriction that must not widen) and the zygote switch. Nothing else: no credentials.
INHERITED_ENV = ("PATH", "HOME", "LANG", "TZ", "TMPDIR", "USER", "CUDA_VISIBLE_DEVICES", contract.ENV_ZYGOTE)
INHERITED_ENV_PREFIXES = ("LC_",)


@dataclass
class ReplicaSpec:
    """One replica of one role, ready to start (the rendezvous is added at spawn time).

    Args:
        role: the role's plan, mount destinations already rewritten to host paths.
        role_index: the role's position in the AppDef.
        replica_id: the replica's index in its role.
        env: the complete environment of the replica's agent.
        cwd: its working directory (the role's image when that is a directory); ``None``: the caller's.
        cpus: the cores it is pinned to (empty: not pinned).
        gpus: the GPU ids it sees as ``CUDA_VISIBLE_DEVICES`` (empty: none set here).
        log_dir: its log directory, ``<log_dir>/<app_id>/<role>/<replica>``.
        img_root: the ``${img_root}`` macro's value.
    """

    role: RolePlan  # mount destinations already rewritten to host paths
    role_index: int
    replica_id: int
    env: dict[str, str]  # the complete environment of the agent
    cwd: str | None
    cpus: tuple[int, ...]
    gpus: tuple[str, ...]
    log_dir: str  # <log_dir>/<app_id>/<role>/<replica>
    img_root: str

    @property
    def key(self) -> tuple[str, int]:
        """``(role name, replica id)``."""
        return (self.role.name, self.replica_id)

    @property
    def result_file(self) -> str:
        """Where the replica's agent writes its result."""
        return os.path.join(self.log_dir, "result.json")

    @property
    def console_file(self) -> str:
        """Everything the agent printed (its log and the ranks' prefixed lines)."""
        return os.path.join(self.log_dir, "console.log")


@dataclass
class Prepared:
    """Every replica of a run, ready to start.

    Args:
        replicas: one spec per replica, role by role.
        notes: what is worth telling the user (oversubscribed CPUs, advisory settings).
        env: the environment of the run's own helper processes (the rendezvous store).
    """

    replicas: list[ReplicaSpec]
    notes: list[str]  # worth telling the user (oversubscribed CPUs, advisory settings)
    env: dict[str, str]  # the environment of the run's own helper processes (the rendezvous store)


def base_env(parent: Mapping[str, str], inherit: bool) -> dict[str, str]:
    """The environment a run starts from: all of ``parent``, or (``inherit`` False) only
    :data:`INHERITED_ENV` and ``LC_*``, plus the ``PYTHONPATH`` entry that holds torchstep
    itself when that is how this interpreter finds it (the agent must import itself).

    Args:
        parent: the caller's environment.
        inherit: the run option ``inherit_env``.

    Returns:
        A new mapping.

    >>> sorted(base_env({"PATH": "/bin", "LC_ALL": "C", "AWS_SECRET_ACCESS_KEY": "x"}, inherit=False))
    ['LC_ALL', 'PATH']
    """
    if inherit:
        return dict(parent)
    out = {k: v for k, v in parent.items() if k in INHERITED_ENV or k.startswith(INHERITED_ENV_PREFIXES)}
    root = os.path.dirname(os.path.dirname(os.path.abspath(contract.__file__)))
    own = [p for p in parent.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.abspath(p) == root]
    if own:
        out["PYTHONPATH"] = own[0]
    return out


def app_dir(opts: LocalOptions, app_id: str) -> str:
    """The run's directory, ``<log_dir>/<app_id>`` (not created).

    Args:
        opts: the run's options.
        app_id: the run's id.
    """
    return os.path.join(opts.log_dir, app_id)


def prepare(
    plan: StepPlan,
    opts: LocalOptions,
    *,
    app_id: str,
    parent_env: Mapping[str, str] | None = None,
) -> Prepared:
    """Validate what only this machine can tell and build every replica's spec. Starts nothing.

    Args:
        plan: a plan for the ``local`` target.
        opts: the run's options.
        app_id: the run's id.
        parent_env: the environment the run starts from; ``None``: ``os.environ``.

    Returns:
        The replicas' specs and the notes for the user.

    Raises:
        SpecError: what this machine cannot serve (a missing mount, too few GPUs, a port in
            use, an unset secret variable, secrets with ``inherit_env=False``), naming the field.
    """
    parent = dict(os.environ if parent_env is None else parent_env)
    start = base_env(parent, opts.inherit_env)
    roles = [mounts.apply(r, i) for i, r in enumerate(plan.roles)]
    gpus = resources.gpu_slices(roles, list(opts.gpus) if opts.gpus is not None else resources.detect_gpus(parent))
    notes = []
    cpus: dict[tuple[str, int], tuple[int, ...]] = {}
    if opts.cpu_affinity:
        cores = resources.usable_cores()
        cpus, oversubscribed = resources.cpu_slices(roles, cores)
        if oversubscribed:
            notes.append(f"resource.cpu of all replicas exceeds the {len(cores)} core(s) here: replicas share cores")
    for i, role in enumerate(roles):
        for j, m in enumerate(role.mounts):
            if m.read_only:
                notes.append(f"roles[{i}].mounts[{j}]: read_only is not enforced without a container")
    ports = resources.role_ports(roles)
    out = []
    for i, role in enumerate(roles):
        img_root = role.workdir or os.getcwd()
        for r in range(role.num_replicas):
            key = (role.name, r)
            log_dir = os.path.join(app_dir(opts, app_id), role.name, str(r))
            env = dict(start)
            if role.secret_env and not opts.inherit_env:
                raise SpecError(
                    f"roles[{role.index}].metadata['torchstep']['secret_env']",
                    "local",
                    "inherit_env=False: the step reads nothing from this process's environment, secrets included",
                    fix="run on the kubernetes target (Secrets by reference), or with inherit_env=True",
                )
            env.update(role.secret_values(parent))  # SpecError naming a missing secret variable
            env.update(
                agent_command.replica_env(role, app_id=app_id, replica_id=r, rank0_host=LOCALHOST, img_root=img_root)
            )
            # the shim first (a role's own torchrun becomes our agent), then this interpreter's
            # bin directory: `python` in an AppDef is the Python that launched the run
            env["PATH"] = os.pathsep.join(
                [contract.shim_dir(), os.path.dirname(sys.executable), env.get("PATH", os.defpath)]
            )
            env[contract.ENV_PYTHON] = sys.executable  # the torchrun shim runs the agent with it
            env[contract.ENV_RESULT_FILE] = os.path.join(log_dir, "result.json")
            env[contract.ENV_LOG_DIR] = log_dir
            env.setdefault("PYTHONUNBUFFERED", "1")  # output reaches the logs as it happens
            if key in gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[key])
            if key in cpus and "OMP_NUM_THREADS" not in role.env:
                env["OMP_NUM_THREADS"] = str(max(1, len(cpus[key]) // role.nproc_per_node))
            elif role.nproc_per_node > 1 and "OMP_NUM_THREADS" not in env:
                # torchrun's own default for several workers, set here: torch then prints no
                # four-line banner per agent into every step's log (issue 37 §3, item 11)
                env["OMP_NUM_THREADS"] = "1"
            env.update(ports.get(key, {}))
            if role.grace_period_s is None:
                env[contract.ENV_GRACE_PERIOD] = f"{opts.grace_period:g}"  # the supervisor waits that long
            out.append(
                ReplicaSpec(
                    role=role,
                    role_index=i,
                    replica_id=r,
                    env=env,
                    cwd=role.workdir,
                    cpus=cpus.get(key, ()),
                    gpus=gpus.get(key, ()),
                    log_dir=log_dir,
                    img_root=img_root,
                )
            )
    return Prepared(out, notes, start)


def with_restarts(role: RolePlan, restarts: int) -> RolePlan:
    """``role`` whose agents get ``--max-restarts restarts`` (what is left of the budget).

    Args:
        role: the role's plan.
        restarts: the restarts left.

    Returns:
        A copy of the plan with that budget.
    """
    return dataclasses.replace(role, retry=dataclasses.replace(role.retry, count=max(0, restarts)))
