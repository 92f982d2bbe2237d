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

from torchstep.plan.options import convert
from torchstep.policy.overlay import check_overlay
from torchstep.policy.rules import (
    CFG_RULES,
    DEPLOYMENT_OWN,
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
            yield self.error("target", f"target {self.target!r} is not allowed by the deployment's policy",
                             f"use one of: {listed(self.p.targets)} (policy targets)")  # fmt: skip
            return
        yield from self.cfg(cfg)
        roles = getattr(app, "roles", None)
        for i, role in enumerate(roles if isinstance(roles, list | tuple) else []):
            yield from self.role(f"app.roles[{i}]", role)

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
                yield self.error(path, "is not a run option the deployment's policy knows for this target",
                                 f"use one of: {', '.join(rules)}")  # fmt: skip
            elif rule == "entry":
                yield self.error(path, "is set by the entry point, never by a run request (the deployment's policy)",
                                 "remove it")  # fmt: skip
            elif rule == "option" and key not in self.p.options:
                yield self.error(path, f"run option {key!r} is not allowed by the deployment's policy",
                                 "remove it, or the deployment lists it in the policy's options")  # fmt: skip
            elif rule == "option" and key == "annotations":
                yield from self.annotations(path, value)
            elif rule == "inherit_env" and convert(path, bool, value, target=self.target) is not False:
                yield self.error(path, "the deployment's policy: a step from the network never inherits the worker's environment",
                                 "remove it (the step gets PATH, HOME, LANG, LC_*, TZ, TMPDIR, USER and its own env)")  # fmt: skip
            elif rule in ("namespace", "service_account"):
                allowed = self.p.namespaces if rule == "namespace" else self.p.service_accounts
                if not isinstance(value, str) or not (value == DEPLOYMENT_OWN[rule] or named(value, allowed)):
                    yield self.error(path, f"{rule.replace('_', ' ')} {value!r} is not allowed by the deployment's policy",
                                     f"leave it out (the deployment's own is used) or use one of: "
                                     f"{listed(allowed)} (policy {rule}s)")  # fmt: skip
            elif rule == "secrets":
                for name in convert(path, list, value, target=self.target):
                    if not named(name, self.p.secrets):
                        yield self.secret_error(path, name)
            elif rule == "path":
                yield from self.host_path(path, value, self.p.bind_mounts, "bind_mounts", "a run directory at")

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
                yield self.error(f"{path}[{key!r}]", "this annotation lifts the container's confinement",
                                 "remove it (the deployment's policy refuses it unless overlay = 'any')")  # fmt: skip

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
        for name in env if isinstance(env, Mapping) else ():
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
            yield self.error(path, f"image {image!r} is not allowed by the deployment's policy",
                             f"use an image under: {listed(self.p.images)} (policy images)")  # fmt: skip

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
            yield self.error(path, f"environment variable {name!r} is denied by the deployment's policy "
                             "(it changes how programs load, or names nothing checkable)",
                             f"remove it (denied: {', '.join(self.p.env_denied)})")  # fmt: skip

    def secret_error(self, path: str, secret: Any) -> PolicyError:
        """The refusal of a Secret the policy does not list.

        Args:
            path: the field that names it.
            secret: the Secret's name.
        """
        return self.error(path, f"Secret {secret!r} is not allowed by the deployment's policy",
                          f"use one of: {listed(self.p.secrets)} (policy secrets)")  # fmt: skip

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
            yield self.error(f"{p}.num_replicas", f"{n!r} replicas is more than the deployment's policy allows",
                             f"at most {self.p.replicas} (policy replicas)")  # fmt: skip
        res = getattr(role, "resource", None)
        devices = getattr(res, "devices", None)
        gpus = [v for k, v in devices.items() if str(k).endswith("/gpu")] if isinstance(devices, Mapping) else []
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
                yield self.error(f"{p}.resource.{field}", f"{what} is more than the deployment's policy allows per replica",
                                 f"set resource.{field} to at most {limit:g} (policy {field})")  # fmt: skip

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
                yield self.error(f"{path}.src", f"volume claim {claim!r} is not allowed by the deployment's policy",
                                 f"use one of: {listed(self.p.volume_mounts)} (policy volume_mounts)")  # fmt: skip
        elif kind == "DeviceMount":
            yield from self.host_path(f"{path}.src_path", getattr(m, "src_path", None), self.p.device_mounts,
                                      "device_mounts", "a device mount of")  # fmt: skip
        else:
            yield from self.host_path(f"{path}.src_path", getattr(m, "src_path", None), self.p.bind_mounts,
                                      "bind_mounts", "a bind mount of host path")  # fmt: skip

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
            yield self.error(path, f"{what} {norm if norm is not None else value!r} is not allowed by the "
                             "deployment's policy", f"use a path under: {listed(allowed)} (policy {name})")  # fmt: skip
        elif real is not None and not under(real, allowed, real=True):
            yield self.error(path, f"{what} {norm!r} leads to {real!r} (a symlink), which the deployment's policy "
                             "does not allow", f"use a path under: {listed(allowed)} (policy {name})")  # fmt: skip


def _amount(value: Any) -> float | None:
    """A resource amount; ``None`` when unset (TorchX's -1, or 0) or not a number."""
    if not isinstance(value, int | float) or isinstance(value, bool) or value in (-1, 0):
        return None
    return float(value)
