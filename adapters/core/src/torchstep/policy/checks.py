"""The checks behind :meth:`torchstep.policy.Policy.check`: the target, each run option,
and each field of each role (image, env, resources, mounts, secrets, the pod overlay).

Example::

    >>> from torchx import specs
    >>> from torchstep.policy import DEFAULT
    >>> app = specs.AppDef("a", roles=[specs.Role("w", image="x", entrypoint="sh", env={"PATH": "/evil"})])
    >>> [e.field for e in Checker(DEFAULT, "local").run(app, {"log_dir": "/etc"})]
    ["cfg['log_dir']", "app.roles[0].env['PATH']"]
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator, Mapping
from typing import Any

from torchstep.plan.cmdline import parse_torchrun, positive_int
from torchstep.plan.options import convert
from torchstep.policy.overlay import check_overlay, seconds
from torchstep.policy.rules import (
    CFG_RULES,
    DEPLOYMENT_OWN,
    MAX_NESTING,
    PRIVILEGE_ANNOTATIONS,
    PolicyError,
    image_allowed,
    listed,
    named,
    norm_path,
    under,
)


class Checker:
    """Walks an AppDef, its target and run options against ``policy`` (a Policy).

    Args:
        policy: the :class:`~torchstep.policy.Policy`.
        target: the target the AppDef was sent for.
    """

    def __init__(self, policy: Any, target: str) -> None:
        self.p = policy
        self.target = target

    def error(self, field: str, problem: str, fix: str) -> PolicyError:
        """The refusal of ``field``; its text always says whose rule it is.

        Args:
            field: the refused field's path.
            problem: what the policy does not allow.
            fix: what it allows.
        """
        if "the deployment's policy" not in problem:
            problem += ", which the deployment's policy does not allow"
        return PolicyError(field, self.target, problem, fix=fix)

    def run(self, app: Any, cfg: Mapping[str, Any] | None) -> Iterator[PolicyError]:
        """Every refusal for the target, ``cfg`` and each role of ``app``, in order.

        Args:
            app: the AppDef as it arrived.
            cfg: its run options; ``None``: none.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        if self.target not in self.p.targets:
            yield self.error(
                "target",
                f"target {self.target!r} is not allowed by the deployment's policy",
                f"use one of: {listed(self.p.targets)} (policy targets)",
            )
            return
        yield from self.cfg(cfg)
        roles = getattr(app, "roles", None)
        roles = roles if isinstance(roles, list | tuple) else []
        if self.p.roles is not None and len(roles) > self.p.roles:
            # before any role is looked at: a policy check costs what the limits allow, not what was sent
            yield self.error(
                "app.roles",
                f"{len(roles)} roles is more than the deployment's policy allows",
                f"send at most {self.p.roles} roles (policy roles)",
            )
            return
        processes: int | None = 0
        for i, role in enumerate(roles):
            yield from self.role(f"app.roles[{i}]", role)
            n = self.processes_of(role)
            processes = None if n is None or processes is None else processes + n
        if self.p.processes is not None and (processes is None or processes > self.p.processes):
            what = (
                "a number of worker processes the policy cannot count"
                if processes is None
                else (f"{processes} worker processes in all (replicas x processes per replica)")
            )
            yield self.error(
                "app.roles",
                f"{what} is more than the deployment's policy allows",
                f"at most {self.p.processes} (policy processes), each role's counts as numbers",
            )

    # -- run options --------------------------------------------------------------------------
    def cfg(self, cfg: Mapping[str, Any] | None) -> Iterator[PolicyError]:
        """The run options: namespace, service account, pull secrets, trust-changing options.

        Args:
            cfg: the run options; ``None``: none.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        if cfg is None:
            return
        if not isinstance(cfg, Mapping):
            yield self.error("cfg", f"must be a mapping, got {type(cfg).__name__}", 'e.g. {"timeout": 600}')
            return
        rules = CFG_RULES[self.target]
        for key, value in cfg.items():
            path = f"cfg[{key!r}]"
            rule = rules.get(key) if isinstance(key, str) else None
            if value is None:
                continue
            if rule is None:
                yield self.error(
                    path,
                    "is not a run option the deployment's policy knows for this target",
                    f"use one of: {', '.join(rules)}",
                )
            elif rule == "entry":
                yield self.error(
                    path, "is set by the entry point, never by a run request (the deployment's policy)", "remove it"
                )
            elif rule == "option" and key not in self.p.options:
                yield self.error(
                    path,
                    f"run option {key!r} is not allowed by the deployment's policy",
                    "remove it, or the deployment lists it in the policy's options",
                )
            elif rule == "option" and key == "annotations":
                yield from self.annotations(path, value)
            elif rule == "inherit_env" and convert(path, bool, value, target=self.target) is not False:
                yield self.error(
                    path,
                    "the deployment's policy: a step from the network never inherits the worker's environment",
                    "remove it (the step gets PATH, HOME, LANG, LC_*, TZ, TMPDIR, USER and its own env)",
                )
            elif rule in ("namespace", "service_account"):
                allowed = self.p.namespaces if rule == "namespace" else self.p.service_accounts
                if not isinstance(value, str) or not (value == DEPLOYMENT_OWN[rule] or named(value, allowed)):
                    yield self.error(
                        path,
                        f"{rule.replace('_', ' ')} {value!r} is not allowed by the deployment's policy",
                        f"leave it out (the deployment's own is used) or use one of: "
                        f"{listed(allowed)} (policy {rule}s)",
                    )
            elif rule == "secrets":
                for name in convert(path, list, value, target=self.target):
                    if not named(name, self.p.secrets):
                        yield self.secret_error(path, name)
            elif rule == "path":
                yield from self.host_path(path, value, self.p.bind_mounts, "bind_mounts", "a run directory at")
            if key == "grace_period":
                yield from self.grace(path, value)

    def grace(self, path: str, value: Any) -> Iterator[PolicyError]:
        """A grace period (seconds between the stop signal and SIGKILL) within the policy's cap.

        Args:
            path: the field path (``cfg['grace_period']``).
            value: the seconds as sent (a number or numeric text).

        Yields:
            One :class:`PolicyError` when refused.
        """
        limit = self.p.grace_period
        if limit is None:
            return
        s = seconds(value)
        if s is None or s > limit:
            yield self.error(
                path,
                f"a grace period of {value!r} s lets the step outlive cancel and timeout, "
                "which the deployment's policy does not allow",
                f"at most {limit:g} seconds (policy grace_period)",
            )

    def annotations(self, path: str, value: Any) -> Iterator[PolicyError]:
        """Annotations that change a pod's privileges (unless the overlay mode is ``any``).

        Args:
            path: the option's field path.
            value: the annotations, typed or as text.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        for key in convert(path, dict, value, target=self.target):
            if self.p.overlay != "any" and key.startswith(PRIVILEGE_ANNOTATIONS):
                yield self.error(
                    f"{path}[{key!r}]",
                    "this annotation lifts the container's confinement",
                    "remove it (the deployment's policy refuses it unless overlay = 'any')",
                )

    # -- the AppDef ---------------------------------------------------------------------------
    def role(self, p: str, role: Any) -> Iterator[PolicyError]:
        """One role: image, env, Secrets, mounts, limits and pod overlay.

        Args:
            p: the role's field path (``app.roles[0]``).
            role: the ``torchx.specs.Role``.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        yield from self.image(f"{p}.image", getattr(role, "image", None))
        env = getattr(role, "env", None)
        env = env if isinstance(env, Mapping) else {}
        yield from self.sizes(p, role, env)
        for name in env:
            yield from self.env_name(f"{p}.env[{name!r}]", name)
        yield from self.limits(p, role)
        mounts = getattr(role, "mounts", None)
        for j, m in enumerate(mounts if isinstance(mounts, list | tuple) else ()):
            yield from self.mount(f"{p}.mounts[{j}]", m)
        md = getattr(role, "metadata", None)
        md = md if isinstance(md, Mapping) else {}
        opts = md.get("torchstep")
        secret_env = opts.get("secret_env") if isinstance(opts, Mapping) else None
        for name, ref in secret_env.items() if isinstance(secret_env, Mapping) else ():
            sub = f"{p}.metadata['torchstep']['secret_env'][{name!r}]"
            yield from self.env_name(sub, name)
            secret = ref.partition("/")[0] if isinstance(ref, str) else ref
            if not isinstance(secret, str) or not named(secret, self.p.secrets):
                yield self.secret_error(sub, secret)
        if isinstance(opts, Mapping) and "grace_period" in opts:
            yield from self.grace(f"{p}.metadata['torchstep']['grace_period']", opts["grace_period"])
        if "kubernetes" in md:
            yield from check_overlay(self, f"{p}.metadata['kubernetes']", md["kubernetes"])

    def image(self, path: str, image: Any) -> Iterator[PolicyError]:
        """The role's image against the policy's ``images``.

        Args:
            path: the image's field path.
            image: the image as it arrived.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        if not self.p.images or (image == "" and self.target == "local"):
            return
        if not isinstance(image, str) or not image_allowed(image, self.p.images):
            yield self.error(
                path,
                f"image {image!r} is not allowed by the deployment's policy",
                f"use an image under: {listed(self.p.images)} (policy images)",
            )

    def env_name(self, path: str, name: Any) -> Iterator[PolicyError]:
        """An env variable name against ``env_denied`` (regardless of case).

        Args:
            path: the variable's field path.
            name: its name as it arrived.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        text = name if isinstance(name, str) else ""
        if not text or "$" in text or any(fnmatch.fnmatchcase(text.upper(), d.upper()) for d in self.p.env_denied):
            yield self.error(
                path,
                f"environment variable {name!r} is denied by the deployment's policy "
                "(it changes how programs load, or names nothing checkable)",
                f"remove it (denied: {', '.join(self.p.env_denied)})",
            )

    def secret_error(self, path: str, secret: Any) -> PolicyError:
        """The refusal of a Secret the policy does not list.

        Args:
            path: the field that names it.
            secret: the Secret's name.
        """
        return self.error(
            path,
            f"Secret {secret!r} is not allowed by the deployment's policy",
            f"use one of: {listed(self.p.secrets)} (policy secrets)",
        )

    def limits(self, p: str, role: Any) -> Iterator[PolicyError]:
        """Replicas and per-replica resources against the policy's limits.

        Args:
            p: the role's field path.
            role: the ``torchx.specs.Role``.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        n = getattr(role, "num_replicas", None)
        if self.p.replicas is not None and (not isinstance(n, int) or n > self.p.replicas):
            yield self.error(
                f"{p}.num_replicas",
                f"{n!r} replicas is more than the deployment's policy allows",
                f"at most {self.p.replicas} (policy replicas)",
            )
        nproc, where = self.nproc_of(role)
        if self.p.nproc is not None and (nproc is None or nproc > self.p.nproc):
            what = "a count the policy cannot check" if nproc is None else f"{nproc} processes"
            yield self.error(
                f"{p}{where}",
                f"{what} per replica is more than the deployment's policy allows",
                f"at most {self.p.nproc}, as a number (metadata['torchstep']['nproc_per_node'] "
                "or torchrun's --nproc-per-node; policy nproc)",
            )
        res = getattr(role, "resource", None)
        devices = getattr(res, "devices", None)
        devices = devices if isinstance(devices, Mapping) else {}
        for name in devices:
            yield from self.extended_resource(f"{p}.resource.devices[{name!r}]", name)
        gpus = [v for k, v in devices.items() if isinstance(k, str) and named(k, self.p.gpu_resources)]
        for field, limit in (("gpu", self.p.gpu), ("cpu", self.p.cpu), ("memMB", self.p.memMB)):
            if limit is None:
                continue
            value = _amount(getattr(res, field, None))
            if field == "gpu":
                total = (value or 0) + sum(v for v in gpus if isinstance(v, int) and not isinstance(v, bool))
                bad, what = total > limit, f"{total:g} GPU(s)"
            else:  # unset means the whole node: within no limit
                bad, what = value is None or value > limit, "unset (no limit)" if value is None else f"{value:g}"
            if bad:
                yield self.error(
                    f"{p}.resource.{field}",
                    f"{what} is more than the deployment's policy allows per replica",
                    f"set resource.{field} to at most {limit:g} (policy {field})",
                )

    def mount(self, path: str, m: Any) -> Iterator[PolicyError]:
        """One mount: a bind or device path under the allowed prefixes, a volume's claim listed.

        Args:
            path: the mount's field path.
            m: the ``BindMount``, ``VolumeMount`` or ``DeviceMount``.

        Yields:
            One :class:`PolicyError` per refused field.
        """
        kind = type(m).__name__
        if kind == "VolumeMount":
            claim = getattr(m, "src", None)
            if not isinstance(claim, str) or not named(claim, self.p.volume_mounts):
                yield self.error(
                    f"{path}.src",
                    f"volume claim {claim!r} is not allowed by the deployment's policy",
                    f"use one of: {listed(self.p.volume_mounts)} (policy volume_mounts)",
                )
        elif kind == "DeviceMount":
            refused = list(
                self.host_path(
                    f"{path}.src_path",
                    getattr(m, "src_path", None),
                    self.p.device_mounts,
                    "device_mounts",
                    "a device mount of",
                )
            )
            yield from refused
            if not refused and self.target == "kubernetes" and self.p.overlay != "any":
                # a pod reaches a host device only from a privileged container, which sees every device
                # of the node: the same privilege an overlay's securityContext may not ask for
                yield self.error(
                    path,
                    "a device mount on Kubernetes runs the container privileged (every device "
                    "of the node, not only this one), which the deployment's policy refuses unless "
                    "overlay = 'any'",
                    "request the device through its device plugin's extended "
                    "resource (Resource.devices; policy extended_resources), or run it on the local "
                    "target",
                )
        else:
            yield from self.host_path(
                f"{path}.src_path",
                getattr(m, "src_path", None),
                self.p.bind_mounts,
                "bind_mounts",
                "a bind mount of host path",
            )

    def extended_resource(self, path: str, name: Any) -> Iterator[PolicyError]:
        """An extended resource name against the policy's ``extended_resources`` (an allow-list).

        Args:
            path: the field path.
            name: the resource name as sent (``nvidia.com/mig-3g.40gb``).

        Yields:
            One :class:`PolicyError` when refused.
        """
        if not isinstance(name, str) or not named(name, self.p.extended_resources):
            yield self.error(
                path,
                f"extended resource {name!r} is not one the deployment's policy allows",
                f"use one of: {listed(self.p.extended_resources)} (policy extended_resources)",
            )

    def sizes(self, p: str, role: Any, env: Mapping[Any, Any]) -> Iterator[PolicyError]:
        """One role's argv and env against ``args_bytes`` and ``env_bytes``.

        Args:
            p: the role's field path.
            role: the ``torchx.specs.Role``.
            env: its env (a mapping).

        Yields:
            One :class:`PolicyError` per refused field.
        """
        args = getattr(role, "args", None)
        argv = [getattr(role, "entrypoint", None), *(args if isinstance(args, list | tuple) else [])]
        for field, limit, texts, name in (
            ("args", self.p.args_bytes, argv, "args_bytes"),
            ("env", self.p.env_bytes, [t for kv in env.items() for t in kv], "env_bytes"),
        ):
            if limit is None:
                continue
            size = sum(_utf8_len(t) for t in texts)
            if size > limit:
                yield self.error(
                    f"{p}.{field}",
                    f"{size} bytes of {'entrypoint and args' if field == 'args' else 'env'}"
                    " is more than the deployment's policy allows",
                    f"at most {limit} bytes (policy {name}): put large inputs in a file the step reads",
                )

    def nproc_of(self, role: Any) -> tuple[int | None, str]:
        """Worker processes per replica as the planner will count them (``None`` when the
        AppDef says it in a way no policy can check: torchrun's ``--nproc-per-node auto``),
        and the field that says it (``.args``, ``.metadata['torchstep']['nproc_per_node']``).

        Args:
            role: the ``torchx.specs.Role``.
        """
        md = getattr(role, "metadata", None)
        opts = md.get("torchstep") if isinstance(md, Mapping) else None
        want = opts.get("nproc_per_node") if isinstance(opts, Mapping) else None
        entrypoint, args = getattr(role, "entrypoint", None), getattr(role, "args", None)
        call = None
        if isinstance(entrypoint, str) and isinstance(args, list | tuple) and all(isinstance(a, str) for a in args):
            call = parse_torchrun(entrypoint, list(args))
        if call is not None and call.nproc_per_node is not None:
            return positive_int(call.nproc_per_node, 1 << 62), ".args"
        if want is not None:
            ok = isinstance(want, int) and not isinstance(want, bool) and want > 0
            return (want if ok else None), ".metadata['torchstep']['nproc_per_node']"
        return 1, ".num_replicas"

    def processes_of(self, role: Any) -> int | None:
        """Worker processes of every replica of ``role``; ``None``: not countable.

        Args:
            role: the ``torchx.specs.Role``.
        """
        n, nproc = getattr(role, "num_replicas", None), self.nproc_of(role)[0]
        if not isinstance(n, int) or isinstance(n, bool) or nproc is None:
            return None
        return n * nproc

    def host_path(self, path: str, value: Any, allowed: tuple[str, ...], name: str, what: str) -> Iterator[PolicyError]:
        """A host path under ``allowed`` (on the local target its real path too).

        Args:
            path: the field path.
            value: the host path as it arrived.
            allowed: the policy's prefixes.
            name: the policy field that lists them (for the fix).
            what: what the path is, as the message says it (``a bind mount of host path``).

        Yields:
            One :class:`PolicyError` per refused field.
        """
        norm = norm_path(value)
        # on this machine a symlink under an allowed prefix may lead out of it: the real path counts too
        real = os.path.realpath(norm) if norm is not None and self.target == "local" else norm
        if norm is None or not under(norm, allowed):
            yield self.error(
                path,
                f"{what} {norm if norm is not None else value!r} is not allowed by the deployment's policy",
                f"use a path under: {listed(allowed)} (policy {name})",
            )
        elif real is not None and not under(real, allowed, real=True):
            yield self.error(
                path,
                f"{what} {norm!r} leads to {real!r} (a symlink), which the deployment's policy does not allow",
                f"use a path under: {listed(allowed)} (policy {name})",
            )


def _amount(value: Any) -> float | None:
    """A resource amount; ``None`` when unset (TorchX's -1, or 0) or not a number."""
    if not isinstance(value, int | float) or isinstance(value, bool) or value in (-1, 0):
        return None
    return float(value)


def _utf8_len(text: Any) -> int:
    """Bytes of ``text`` in UTF-8 (a non-string: its ``str``, which the planner refuses anyway)."""
    text = text if isinstance(text, str) else str(text)
    return len(text.encode("utf-8", "surrogatepass"))


def sent_size(value: Any, limit: float) -> tuple[int, bool]:
    """About how many bytes ``value`` (JSON data) takes as JSON, counted until ``limit`` is
    passed, and whether it nests deeper than :data:`MAX_NESTING`. Iterative and stopping at
    the limit: a deep or huge request costs no more than the limit allows.

    Args:
        value: the data as it arrived.
        limit: where to stop counting.

    Returns:
        ``(bytes counted, too deep)``.

    >>> sent_size({"a": [1, "xy", None]}, 1000)
    (22, False)
    """
    size = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack and size <= limit:
        v, depth = stack.pop()
        if depth > MAX_NESTING:
            return size, True
        if isinstance(v, str):
            size += len(v) + 2
        elif isinstance(v, Mapping):
            size += 2
            for k, x in v.items():
                size += (len(k) if isinstance(k, str) else 8) + 4
                stack.append((x, depth + 1))
                if size > limit:
                    break
        elif isinstance(v, list | tuple):
            size += 2
            for x in v:
                size += 1
                stack.append((x, depth + 1))
                if size > limit:
                    break
        elif isinstance(v, int) and not isinstance(v, bool):
            size += v.bit_length() // 3 + 1  # about its decimal digits, without converting a huge int
        else:  # None, a bool, a float, or something JSON has no word for
            size += 5
    return size, False
