"""What an AppDef that arrives over the network may do: the deployment's :class:`Policy`.

The generic DAG (``torchstep_airflow.torchx_dag``) and the generic flow
(``torchstep_prefect.torchx_flow``) run an AppDef, a target and run options that anyone
allowed to trigger a run sends. Before anything is created they check it against the
deployment owner's policy; what the policy does not allow is a :class:`PolicyError` (a
:class:`~torchstep.SpecError`) naming the field and what the policy allows. The policy is
the one passed to the entry point, else the TOML file named by ``TORCHSTEP_POLICY``, else
:data:`DEFAULT` (docs/security.md).

:data:`DEFAULT` refuses what turns a step into a way onto the host or into the cluster:
bind mounts, device mounts, a pod overlay that sets a host-level or privilege field,
environment variables that load code, a namespace, service account, Secret or
trust-changing run option the deployment did not list; extended resources, volume kinds,
pod fields and token audiences pass only when listed (allow-lists). It allows any image, and
caps the size of what is sent (roles, replicas, processes, argv, env, the request itself:
checked before the AppDef is planned) and the grace period a pod or process may take to stop.

Example::

    >>> from torchx import specs
    >>> role = specs.Role("w", image="python:3.11", entrypoint="python",
    ...                   mounts=[specs.BindMount(src_path="/data/../etc", dst_path="/etc")])
    >>> DEFAULT.check(specs.AppDef("a", roles=[role]), "kubernetes", {})
    Traceback (most recent call last):
    ...
    torchstep.policy.PolicyError: app.roles[0].mounts[0].src_path (target 'kubernetes'): a bind mount of host path '/etc' is not allowed by the deployment's policy; fix: ...
    >>> Policy(bind_mounts=("/data",)).check(specs.AppDef("a", roles=[role]), "kubernetes", {})
    Traceback (most recent call last):
    ...
    torchstep.policy.PolicyError: app.roles[0].mounts[0].src_path (target 'kubernetes'): a bind mount of host path '/etc' ...
    >>> DEFAULT.check(specs.AppDef("a", roles=[specs.Role("w", image="python:3.11", entrypoint="python")]),
    ...               "kubernetes", {"namespace": "kube-system"})
    Traceback (most recent call last):
    ...
    torchstep.policy.PolicyError: cfg['namespace'] (target 'kubernetes'): namespace 'kube-system' is not allowed ...
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchstep.policy.rules import (
    CFG_RULES,
    DEFAULT_ENV_DENIED,
    DEFAULT_EXTENDED_RESOURCES,
    DEFAULT_GPU_RESOURCES,
    DEFAULT_POD_FIELDS,
    DEFAULT_VOLUME_SOURCES,
    ENV_POLICY,
    MAX_NESTING,
    OVERLAY_MODES,
    PolicyError,
    norm_path,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as a backport (a dependency of torchstep there)
    import tomli as tomllib

#: The policy's limits (numbers; ``None``: no limit); every other field but ``overlay`` is a list.
_NUMBERS = frozenset(
    {
        "replicas",
        "gpu",
        "cpu",
        "memMB",
        "roles",
        "nproc",
        "processes",
        "args_bytes",
        "env_bytes",
        "conf_bytes",
        "grace_period",
    }
)

PolicyError.__module__ = __name__  # its public home (tracebacks say torchstep.policy.PolicyError)

__all__ = ["DEFAULT", "ENV_POLICY", "OVERLAY_MODES", "Policy", "PolicyError", "load", "resolve", "untrusted_cfg"]


@dataclass(frozen=True)
class Policy:
    """What a deployment allows an AppDef from a DAG-run conf or flow-run parameters to do.

    Name lists (``namespaces``, ``service_accounts``, ``volume_mounts``, ``secrets``,
    ``env_denied``) hold names or ``fnmatch`` patterns (``team-*``); ``env_denied`` matches
    regardless of case. Path lists (``bind_mounts``, ``device_mounts``) hold host path
    prefixes, compared whole component by component on normalised paths (``/data`` allows
    ``/data/x``, not ``/data2`` nor ``/data/../etc``). ``images`` holds image prefixes,
    compared on normalised references (``python`` is ``docker.io/library/python``; an
    entry ending in ``/`` allows every repository under it; empty: any image).

    Args:
        targets: the targets a network AppDef may run on.
        images: allowed image prefixes (empty: any image).
        namespaces: the namespaces ``cfg['namespace']`` may name (absent: the deployment's).
        service_accounts: the service accounts ``cfg`` or an overlay may name (absent: the deployment's).
        bind_mounts: host path prefixes a BindMount (and the local ``log_dir``/``checkpoint_dir``) may use.
        volume_mounts: persistent volume claims a VolumeMount may use (default ``*``: any).
        device_mounts: device paths a DeviceMount may use.
        overlay: ``unprivileged`` | ``none`` | ``any`` (see :data:`OVERLAY_MODES`).
        env_denied: environment variable names no env may set.
        secrets: Kubernetes Secrets ``secret_env``, image pull secrets or an overlay may read.
        options: trust-changing run options a network cfg may set (``gpus``, ``priority_class``,
            ``queue``, ``labels``, ``annotations``).
        extended_resources: extended resources (``Resource.devices``, an overlay's
            ``resources``) a role may request: names or patterns (``nvidia.com/mig-*``).
        gpu_resources: the extended resources that are GPUs: each unit counts against ``gpu``.
        volume_sources: volume kinds an overlay may use (``emptyDir``, ``nfs``...); claims,
            Secrets, tokens and claim templates in them are still checked; a ``hostPath``
            must be under ``bind_mounts``.
        pod_fields: pod spec fields an overlay may set as it likes (see :data:`DEFAULT_POD_FIELDS`;
            ``automountServiceAccountToken`` listed allows it ``true``).
        token_audiences: audiences a projected service account token in an overlay may name.
        localhost_profiles: node-local seccomp / AppArmor profiles (``Localhost``) an overlay may use.
        replicas: most replicas per role (``None``: no limit).
        gpu: most GPUs per replica, ``Resource.gpu`` and every ``gpu_resources`` unit together (``None``: no limit).
        cpu: most CPU cores per replica (``None``: no limit).
        memMB: most memory per replica in MiB, as TorchX's ``Resource.memMB`` (``None``: no limit).
        roles: most roles per AppDef (``None``: no limit).
        nproc: most worker processes per replica (``None``: no limit).
        processes: most worker processes of the whole AppDef, replicas x processes summed over roles.
        args_bytes: most bytes of one role's entrypoint and args together (UTF-8).
        env_bytes: most bytes of one role's env, names and values together (UTF-8).
        conf_bytes: most bytes of the request as JSON (the AppDef and its run options),
            checked before it is parsed or planned.
        grace_period: most seconds a step may take to stop after cancel or timeout
            (``cfg['grace_period']``, ``metadata['torchstep']['grace_period']``, an
            overlay's ``terminationGracePeriodSeconds``).

    Raises:
        PolicyError: a field of the wrong type, an unknown overlay mode, target or option,
            or a mount prefix that is not an absolute path.

    Example::

        >>> p = Policy(targets=("kubernetes",), namespaces=("ml",), gpu=8)
        >>> p.namespaces, p.gpu
        (('ml',), 8)
    """

    targets: tuple[str, ...] = ("local", "kubernetes")
    images: tuple[str, ...] = ()
    namespaces: tuple[str, ...] = ()
    service_accounts: tuple[str, ...] = ()
    bind_mounts: tuple[str, ...] = ()
    volume_mounts: tuple[str, ...] = ("*",)
    device_mounts: tuple[str, ...] = ()
    overlay: str = "unprivileged"
    env_denied: tuple[str, ...] = DEFAULT_ENV_DENIED
    secrets: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    extended_resources: tuple[str, ...] = DEFAULT_EXTENDED_RESOURCES
    gpu_resources: tuple[str, ...] = DEFAULT_GPU_RESOURCES
    volume_sources: tuple[str, ...] = DEFAULT_VOLUME_SOURCES
    pod_fields: tuple[str, ...] = DEFAULT_POD_FIELDS
    token_audiences: tuple[str, ...] = ()
    localhost_profiles: tuple[str, ...] = ()
    replicas: int | None = 16
    gpu: int | None = None
    cpu: float | None = None
    memMB: int | None = None
    roles: int | None = 16
    nproc: int | None = 16
    processes: int | None = 64
    args_bytes: int | None = 64 * 1024
    env_bytes: int | None = 64 * 1024
    conf_bytes: int | None = 256 * 1024
    grace_period: float | None = 300

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _NUMBERS:
                ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value >= 0)
                fractional = f.name in ("cpu", "grace_period")
                if not ok or (not fractional and value is not None and not isinstance(value, int)):
                    kind = "a number" if fractional else "an integer"
                    raise PolicyError(f.name, None, f"must be {kind} >= 0 or unset, got {value!r}", fix="e.g. 8")
            elif f.name == "overlay":
                if value not in OVERLAY_MODES:
                    raise PolicyError(
                        "overlay", None, f"unknown mode {value!r}", fix=f"one of {', '.join(OVERLAY_MODES)}"
                    )
            else:
                if (
                    isinstance(value, str)
                    or not isinstance(value, list | tuple)
                    or not all(isinstance(v, str) and v and "\x00" not in v for v in value)
                ):
                    raise PolicyError(
                        f.name, None, f"must be a list of non-empty strings, got {value!r}", fix='e.g. ["ml"]'
                    )
                object.__setattr__(self, f.name, tuple(value))
        for name in ("bind_mounts", "device_mounts"):
            for p in getattr(self, name):
                if norm_path(p) is None:
                    raise PolicyError(name, None, f"{p!r} is not an absolute path", fix="e.g. /data")
        unknown = [t for t in self.targets if t not in CFG_RULES]
        if unknown:
            raise PolicyError("targets", None, f"unknown target {unknown[0]!r}", fix="local and/or kubernetes")
        bad = [o for o in self.options if not any(CFG_RULES[t].get(o) == "option" for t in CFG_RULES)]
        if bad:
            opts = sorted({o for t in CFG_RULES.values() for o, r in t.items() if r == "option"})
            raise PolicyError(
                "options",
                None,
                f"{bad[0]!r} is not a run option a policy can allow",
                fix=f"one of {', '.join(opts)} (the others are free, value-checked or never allowed)",
            )

    def check(self, app: Any, target: str, cfg: Mapping[str, Any] | None = None) -> None:
        """Raise :class:`PolicyError` for the first field of ``app`` (a ``torchx.specs.AppDef``),
        ``target`` or ``cfg`` (its run options) that this policy does not allow.

        Args:
            app: the AppDef as it arrived (checked before it is planned or run).
            target: ``local`` or ``kubernetes``.
            cfg: the run options that came with it.

        Raises:
            PolicyError: naming the field and what the policy allows.
        """
        for problem in self.problems(app, target, cfg):
            raise problem

    def check_sent(self, data: Any, target: str, cfg: Any = None, *, field: str = "app") -> None:
        """Refuse a request that is too large or too deep before it is parsed or planned:
        ``cfg`` and ``data`` (the AppDef as JSON data) together at most ``conf_bytes`` as
        JSON, nested at most :data:`~torchstep.policy.rules.MAX_NESTING` levels. The cost is
        bounded by the limit, not by what was sent.

        Args:
            data: the AppDef as it arrived (JSON data: a DAG run's conf, a flow's parameters).
            target: the target it was sent for.
            cfg: the run options sent with it.
            field: what ``data`` is called in errors (``conf['app']``).

        Raises:
            PolicyError: naming ``cfg`` or ``field``, the size or depth, and the limit.

        >>> DEFAULT.check_sent({"roles": [{"args": ["x" * 300_000]}]}, "local", field="conf['app']")
        Traceback (most recent call last):
        ...
        torchstep.policy.PolicyError: conf['app'] (target 'local'): the request is more than 262144 bytes as JSON...
        """
        from torchstep.policy.checks import sent_size

        limit = self.conf_bytes if self.conf_bytes is not None else float("inf")
        used = 0.0
        for name, value in (("cfg", cfg), (field, data)):
            size, deep = sent_size(value, limit - used)
            if deep:
                raise PolicyError(
                    name,
                    target,
                    f"nests deeper than {MAX_NESTING} levels, which the deployment's "
                    "policy refuses (no AppDef needs it)",
                    fix="send a flatter request",
                )
            used += size
            if used > limit:
                raise PolicyError(
                    name,
                    target,
                    f"the request is more than {self.conf_bytes} bytes as JSON, which "
                    "the deployment's policy refuses before reading it",
                    fix=f"send at most {self.conf_bytes} bytes (policy conf_bytes): put large "
                    "inputs in a file or volume the step reads",
                )

    def problems(self, app: Any, target: str, cfg: Mapping[str, Any] | None = None) -> list[PolicyError]:
        """Every field :meth:`check` would refuse, in order (empty: allowed).

        Args:
            app: the AppDef as it arrived.
            target: ``local`` or ``kubernetes``.
            cfg: the run options that came with it.

        Returns:
            One :class:`PolicyError` per refused field.

        >>> from torchx import specs
        >>> role = specs.Role("w", image="x", entrypoint="sh", env={"LD_PRELOAD": "/x.so", "ld_audit": "y"})
        >>> [e.field for e in DEFAULT.problems(specs.AppDef("a", roles=[role]), "local")]
        ["app.roles[0].env['LD_PRELOAD']", "app.roles[0].env['ld_audit']"]
        """
        from torchstep.policy.checks import Checker

        return list(Checker(self, target).run(app, cfg))


#: The policy for network-borne AppDefs when the deployment names none.
DEFAULT = Policy()


def load(path: str | os.PathLike[str]) -> Policy:
    """The policy in the TOML file ``path``: top-level keys are :class:`Policy`'s fields
    (a list given replaces the default: ``env_denied`` included).

    Whoever can write the file decides what every run request may do, so the file must be
    owned by root or the caller and writable by nobody else (a symlink to such a file, as a
    Kubernetes ConfigMap mounts it, is fine).

    Args:
        path: the TOML file.

    Returns:
        The policy.

    Raises:
        PolicyError: an unreadable or unsafe file, bad TOML, an unknown key or a bad value
            (naming it).

    Example::

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        ...     _ = f.write('targets = ["kubernetes"]\\nnamespaces = ["ml"]\\ngpu = 8\\n')
        >>> load(f.name).namespaces
        ('ml',)
    """
    where = os.fspath(path)
    try:
        with open(where, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
                raise PolicyError(
                    ENV_POLICY,
                    None,
                    f"the policy file {where} can be changed by another user "
                    f"(owner uid {st.st_uid}, mode {st.st_mode & 0o777:04o})",
                    fix="chown it to root or yourself and chmod go-w it",
                )
            data = tomllib.load(f)
    except OSError as e:
        raise PolicyError(
            ENV_POLICY,
            None,
            f"cannot read the policy file {where}: {e.strerror or e}",
            fix="name a readable TOML file (docs/security.md)",
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise PolicyError(ENV_POLICY, None, f"{where} is not valid TOML: {e}", fix="see docs/security.md") from None
    known = [f.name for f in dataclasses.fields(Policy)]
    for key in data:
        if key not in known:
            raise PolicyError(
                key, None, f"unknown key in the policy file {where}", fix=f"use one of: {', '.join(known)}"
            )
    try:
        return Policy(**data)
    except PolicyError as e:
        raise PolicyError(e.field, None, f"in the policy file {where}: {e.problem}", fix=e.fix) from None


def resolve(policy: Policy | str | os.PathLike[str] | None = None) -> Policy:
    """The policy an entry point applies: ``policy`` itself, the file it names, else the
    file named by ``TORCHSTEP_POLICY``, else :data:`DEFAULT`.

    Args:
        policy: a :class:`Policy`, the path of its TOML file, or ``None``.

    Returns:
        The policy.

    Raises:
        PolicyError: the file named cannot be used (see :func:`load`); never a silent
            fallback to :data:`DEFAULT`.

    >>> resolve(DEFAULT) is DEFAULT
    True
    """
    if isinstance(policy, Policy):
        return policy
    if policy is not None:
        return load(policy)
    named = os.environ.get(ENV_POLICY, "")
    return load(named) if named.strip() else DEFAULT


def untrusted_cfg(target: str, cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run options a network-borne AppDef runs with (after :meth:`Policy.check`): on
    the local target the step does not inherit the caller's environment.

    Args:
        target: ``local`` or ``kubernetes``.
        cfg: the run options that came with the AppDef.

    Returns:
        A copy of ``cfg`` to run with.

    >>> untrusted_cfg("local", {"timeout": 60})
    {'timeout': 60, 'inherit_env': False}
    """
    out = dict(cfg or {})
    if target == "local":
        out["inherit_env"] = False
    return out
