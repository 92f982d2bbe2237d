"""The translation rules: every AppDef field, for every target, honoured / ignored /
rejected. ``torchstep.plan.build_plan`` and ``torchstep.explain`` are the public entry
points; this module is their rule book, one method per field group:

- here: the app (name, metadata, roles), a role's identity and command (name, image,
  base_image, entrypoint, args, env) and its macros;
- :mod:`torchstep.rules_launch`: num_replicas, min_replicas, processes per replica, a
  role's own torchrun;
- :mod:`torchstep.rules_resources`: resource, mounts, port_map;
- :mod:`torchstep.rules_retry`: max_retries, retry_policy and the retry layers;
- :mod:`torchstep.rules_metadata`: role metadata and its ``torchstep`` options, secrets,
  TorchX-nightly-only fields and fields of a newer TorchX.

Example::

    >>> import torchstep
    >>> planner = Planner(torchstep.materialize("utils.echo", []), "kfp")
    >>> planner.run().roles[0].name
    'echo'
    >>> sorted({d.action for d in planner.decisions})
    ['honoured']
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

from torchstep.cmdline import parse_torchrun
from torchstep.macros import RANK0_ENV_VAR, find_macros, nested_strings
from torchstep.names import dns_label, is_env_name
from torchstep.plan import (
    APP_OPTIONS,
    TARGETS,
    Mount,
    Port,
    RolePlan,
    SecretRef,
    StepPlan,
)
from torchstep.rules_base import Rejected
from torchstep.rules_launch import LaunchRules
from torchstep.rules_resources import RDZV_PORT_NAMES, ResourceRules
from torchstep.rules_retry import RetryRules

__all__ = ["RDZV_PORT_NAMES", "Planner"]

# Fields this rule book knows (TorchX 0.7 and nightly); any other dataclass field of a
# newer TorchX is rejected when set, noted when unset: never dropped silently.
APP_FIELDS = frozenset({"name", "roles", "metadata"})
ROLE_FIELDS = frozenset(
    {
        "name",
        "image",
        "min_replicas",
        "base_image",
        "entrypoint",
        "args",
        "env",
        "num_replicas",
        "max_retries",
        "retry_policy",
        "resource",
        "port_map",
        "metadata",
        "mounts",
        "workspace",  # nightly
        "overrides",  # nightly
    }
)
RESOURCE_FIELDS = frozenset({"cpu", "gpu", "memMB", "capabilities", "devices", "tags"})
_MISSING = "<MISSING>"  # torchx.specs.MISSING
T = TypeVar("T")


class Planner(ResourceRules, RetryRules, LaunchRules):
    """Walks an AppDef field by field and records a Decision for each (see plan.py)."""

    def __init__(self, app: Any, target: str) -> None:
        super().__init__(app, target)

    # -- the app ----------------------------------------------------------------------------
    def run(self) -> StepPlan | None:
        """Plan the whole app; ``None`` when a field was rejected (see ``decisions``)."""
        from torchx.specs import AppDef

        t = self.target
        if not isinstance(t, str) or t not in TARGETS:
            self.reject("target", t, f"unknown target {t!r}", f"use one of {', '.join(TARGETS)}")
            return None
        app = self.app
        if not isinstance(app, AppDef):
            self.reject(
                "app",
                type(app).__name__,
                "expected a torchx.specs.AppDef",
                "build one with torchstep.materialize(component, args)",
            )
            return None
        name, k8s_name = self.app_name(app)
        timeout = self.app_metadata(app)
        roles_in = getattr(app, "roles", None)
        if not isinstance(roles_in, list | tuple) or not roles_in:
            self.reject("roles", roles_in, "an AppDef needs at least one role", "add a torchx.specs.Role")
            return None
        self.ok(
            "roles",
            f"{len(roles_in)} role(s)",
            {
                "local": "all roles start together on this machine; one rendezvous per role",
                "kubernetes": "one Pod (1 replica) or Indexed Job + headless Service per role",
                "kfp": "one container component per role",
            }[t],
        )
        roles = self.all_roles(roles_in)
        self.check_retry_layers(roles)
        self.unknown_fields("", app, APP_FIELDS)
        if self.rejected:
            return None
        return StepPlan(
            app_name=name,
            k8s_name=k8s_name,
            target=t,
            roles=tuple(roles),
            timeout_s=timeout,
            decisions=tuple(self.decisions),
            metadata=dict(app.metadata),
        )

    def app_name(self, app: Any) -> tuple[str, str]:
        name = app.name
        t = self.target
        if not isinstance(name, str) or not name.strip() or not name.isprintable() or any(c in name for c in "/\\"):
            self.reject(
                "name", name, "the AppDef needs a printable name without '/' or '\\'", "set AppDef(name='train')"
            )
            return name if isinstance(name, str) else "", "app"
        k8s_name = dns_label(name, max_len=40)
        if not k8s_name and t != "local":
            self.reject(
                "name",
                name,
                "no ASCII letter or digit to derive a Kubernetes-safe name from",
                "use a name with ASCII letters or digits",
            )
            return name, "app"
        k8s_name = k8s_name or "app"
        self.ok(
            "name",
            name,
            {
                "local": f"app id {name}-<run id>; logs under <log_dir>/<app id>/",
                "kubernetes": f"object name prefix {k8s_name!r} + run-unique suffix added at run time",
                "kfp": f"display name {name!r}; launcher objects named {k8s_name!r} + run-unique suffix at run time",
            }[t],
        )
        return name, k8s_name

    def app_metadata(self, app: Any) -> float | None:
        md = app.metadata
        if not isinstance(md, dict):
            self.reject("metadata", md, "must be a dict of strings", "AppDef(metadata={'torchstep.timeout': '3600'})")
            return None
        if not md:
            self.ok("metadata", {}, "none")
        timeout: float | None = None
        for key, value in md.items():
            path = f"metadata[{key!r}]"
            if key == "torchstep.timeout":
                timeout = self.seconds(path, value)
                if timeout is not None:
                    self.ok(path, value, f"step timeout {timeout:g} s: every process of every role is stopped after it")
            elif isinstance(key, str) and key.startswith("torchstep"):
                self.reject(path, value, f"unknown torchstep option {key!r}", f"use one of: {', '.join(APP_OPTIONS)}")
            else:
                self.ignore(path, value, "AppDef metadata is informational for torchstep")
        return timeout

    def all_roles(self, roles_in: list[Any] | tuple[Any, ...]) -> list[RolePlan]:
        roles: list[RolePlan] = []
        seen: dict[str, int] = {}
        seen_k8s: dict[str, int] = {}
        for i, role in enumerate(roles_in):
            try:
                rp = self.role(i, role)
            except Rejected:
                continue
            if rp.name in seen:
                self.reject(
                    f"roles[{i}].name",
                    rp.name,
                    f"duplicate role name (also roles[{seen[rp.name]}])",
                    "give every role a unique name",
                )
                continue
            if rp.k8s_name in seen_k8s and self.target != "local":
                self.reject(
                    f"roles[{i}].name",
                    rp.name,
                    f"maps to the same Kubernetes name {rp.k8s_name!r} as roles[{seen_k8s[rp.k8s_name]}]",
                    "rename one of the roles (names that differ only in case or punctuation collide)",
                )
                continue
            seen[rp.name] = i
            seen_k8s[rp.k8s_name] = i
            roles.append(rp)
        return roles

    # -- one role ---------------------------------------------------------------------------
    def group(self, rule: Callable[[], T], default: T) -> T:
        """Run one field group's rule; ``default`` when it rejected its field."""
        try:
            return rule()
        except Rejected:
            return default

    def role(self, i: int, role: Any) -> RolePlan:
        from torchx.specs import Role

        p = f"roles[{i}]"
        if not isinstance(role, Role):
            raise self.fail(
                p, type(role).__name__, "expected a torchx.specs.Role", "build roles with torchx.specs.Role"
            )
        name, k8s_name = self.role_name(p, i, role)
        # Each group records its own rejections; later groups still run, so `explain`
        # shows every problem of the role at once.
        no_workdir: str | None = None
        image, workdir = self.group(lambda: self.image(p, role), ("", no_workdir))
        entrypoint = self.group(lambda: self.entrypoint(p, role), "")
        args: list[Any] = self.group(lambda: self.args(p, role), [])
        env: dict[str, str] = self.group(lambda: self.env(p, role), {})
        min_r, num_r = self.group(lambda: self.replicas(p, role), (1, 1))
        opts: dict[str, Any] = self.group(lambda: self.role_options(p, role), {})
        call = None
        if entrypoint and all(isinstance(a, str) for a in args):
            call = parse_torchrun(entrypoint, args)
        nproc = self.group(lambda: self.launch(p, entrypoint, opts, call, num_r, min_r), 1)
        resources = self.group(lambda: self.resources(p, role), None)
        mounts: list[Mount] = self.group(lambda: self.mounts(p, role), [])
        ports: list[Port] = self.group(lambda: self.ports(p, role), [])
        budget = self.group(lambda: self.retry(p, role, call), None)
        if budget is not None:
            self.retry_options(p, budget, opts)
        secrets: tuple[SecretRef, ...] = self.group(lambda: self.secret_env(p, opts.get("secret_env"), env), ())
        self.group(lambda: self.other_metadata(p, role), None)
        self.nightly_fields(p, role)
        self.unknown_fields(f"{p}.", role, ROLE_FIELDS)
        self.unknown_fields(f"{p}.resource.", role.resource, RESOURCE_FIELDS)
        bound = [*args, *env.values(), *nested_strings(role.metadata)]
        macros = find_macros([a for a in bound if isinstance(a, str)])
        self.ok(f"{p}.macros", sorted(m.value for m in macros), self.becomes_macros(macros))
        if self.rejected_under(p) or resources is None or budget is None:
            raise Rejected()
        return RolePlan(
            name=name,
            k8s_name=k8s_name,
            image=image,
            entrypoint=entrypoint,
            args=tuple(args),
            env=env,
            secret_env=secrets,
            min_replicas=min_r,
            num_replicas=num_r,
            nproc_per_node=nproc,
            uses_torchrun=call is not None,
            resources=resources,
            mounts=tuple(mounts),
            ports=tuple(ports),
            retry=budget,
            timeout_s=opts.get("timeout"),
            heartbeat_timeout_s=opts.get("heartbeat_timeout"),
            grace_period_s=opts.get("grace_period"),
            retry_delay_s=opts.get("retry_delay"),
            retry_backoff=opts.get("retry_backoff"),
            max_retry_delay_s=opts.get("max_retry_delay"),
            macros=macros,
            metadata=dict(role.metadata),
            workdir=workdir,
            index=i,
        )

    def role_name(self, p: str, i: int, role: Any) -> tuple[str, str]:
        name = role.name
        t = self.target
        if not isinstance(name, str) or not name or not name.isprintable() or any(c in name for c in "/\\ "):
            raise self.fail(
                f"{p}.name",
                name,
                "a role name must be non-empty, printable, without '/', '\\' or spaces",
                "use e.g. 'trainer'",
            )
        if name in (".", ".."):
            raise self.fail(f"{p}.name", name, "'.' and '..' cannot name a role", "use e.g. 'trainer'")
        k8s_name = dns_label(name, max_len=30)
        if not k8s_name and t != "local":
            raise self.fail(
                f"{p}.name",
                name,
                "no ASCII letter or digit to derive a Kubernetes-safe name from",
                "use a role name with ASCII letters or digits",
            )
        k8s_name = k8s_name or f"role-{i}"
        self.ok(
            f"{p}.name",
            name,
            {
                "local": f"one agent process per replica, logs under <log_dir>/<app id>/{name}/",
                "kubernetes": f"Pod or Indexed Job + headless Service named {k8s_name}-<run id>",
                "kfp": f"container component {k8s_name!r}",
            }[t],
        )
        return name, k8s_name

    def image(self, p: str, role: Any) -> tuple[str, str | None]:
        image = role.image
        path = f"{p}.image"
        base = getattr(role, "base_image", None)
        if base:
            self.ignore(f"{p}.base_image", base, "deprecated in TorchX; the image is used as is")
        else:
            self.ok(f"{p}.base_image", base, "unset (deprecated TorchX field)")
        if not isinstance(image, str):
            raise self.fail(path, image, "must be a string", "set Role(image=...)")
        if self.target == "local":
            if image and os.path.isdir(image):
                self.ok(path, image, "working directory of every process (as TorchX local_cwd)")
                return image, os.path.abspath(image)
            self.ignore(
                path,
                image,
                "not a directory: the local target runs on this machine's environment "
                "(a directory image becomes the working directory)",
            )
            return image, None
        if not image or image == _MISSING or not image.isprintable() or any(c.isspace() for c in image):
            raise self.fail(
                path, image, "a container image reference is required", "set Role(image='registry/repo:tag')"
            )
        self.ok(path, image, "container image" if self.target == "kubernetes" else "ContainerSpec image")
        return image, None

    def entrypoint(self, p: str, role: Any) -> str:
        ep = role.entrypoint
        if not isinstance(ep, str) or not ep or ep == _MISSING or "\x00" in ep:
            raise self.fail(f"{p}.entrypoint", ep, "an entrypoint is required", "set Role(entrypoint='python')")
        self.ok(
            f"{p}.entrypoint",
            ep,
            {
                "local": "argv[0] of every worker (run by the agent, no shell)",
                "kubernetes": "container args after the agent (command = torchstep-agent)",
                "kfp": "ContainerSpec args after the agent",
            }[self.target],
        )
        return ep

    def args(self, p: str, role: Any) -> list[Any]:
        args = role.args
        if not isinstance(args, list | tuple):
            raise self.fail(f"{p}.args", args, "must be a list of strings", "Role(args=['--lr', '0.1'])")
        for j, a in enumerate(args):
            if not isinstance(a, str):
                self.reject(f"{p}.args[{j}]", a, f"must be a string, got {type(a).__name__}", "convert it with str()")
            elif "\x00" in a:
                self.reject(
                    f"{p}.args[{j}]", a, "contains a NUL byte, which no process argument can carry", "remove it"
                )
        if not self.rejected_under(f"{p}.args"):
            self.ok(
                f"{p}.args",
                list(args),
                {
                    "local": "argv list byte for byte (never a shell string); macros bound at launch",
                    "kubernetes": "container args byte for byte (never a shell string); macros bound in the pod",
                    "kfp": "ContainerSpec args byte for byte (never a shell string); macros bound in the step",
                }[self.target],
            )
        return list(args)

    def env(self, p: str, role: Any) -> dict[str, str]:
        env = role.env
        if not isinstance(env, dict):
            raise self.fail(f"{p}.env", env, "must be a dict of strings", "Role(env={'KEY': 'value'})")
        out: dict[str, str] = {}
        for k, v in env.items():
            path = f"{p}.env[{k!r}]"
            if not isinstance(k, str) or not is_env_name(k):
                self.reject(path, k, "not a valid environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
            elif not isinstance(v, str):
                self.reject(path, v, f"value must be a string, got {type(v).__name__}", "convert it with str()")
            elif "\x00" in v:
                self.reject(path, "…", "contains a NUL byte, which no environment value can carry", "remove it")
            else:
                out[k] = v
        self.ok(
            f"{p}.env",
            {k: "…" for k in env},  # names only: values may be secrets
            {
                "local": "merged over the launching process's environment",
                "kubernetes": "container env (values in the manifest; use secret_env for secrets)",
                "kfp": "set_env_variable per key (values in the pipeline spec; use secret_env for secrets)",
            }[self.target]
            if env
            else "none",
        )
        return out

    def becomes_macros(self, macros: frozenset[Any]) -> str:
        if not macros:
            return "none used"
        t = self.target
        where = {
            "app_id": {
                "local": "app_id = <app>-<run id>",
                "kubernetes": "app_id = the run-unique object name",
                "kfp": "app_id = the run-unique launcher name (from the KFP run)",
            }[t],
            "replica_id": "replica_id = "
            + {"local": "0..N-1 per agent", "kubernetes": "JOB_COMPLETION_INDEX", "kfp": "the Job index"}[t],
            "rank0_env": f"rank0_env = {RANK0_ENV_VAR} (holds the host of replica 0)",
            "img_root": "img_root = "
            + ("the image directory (or the current directory)" if t == "local" else "'' (as TorchX)"),
            "base_img_root": "base_img_root = "
            + ("the image directory (or the current directory)" if t == "local" else "''"),
        }
        return "bound per replica at run time: " + ", ".join(where[m.value] for m in sorted(macros))
