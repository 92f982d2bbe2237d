"""The translation rules: every AppDef field, for every target, honoured / ignored /
rejected. ``torchstep.plan.build_plan`` and ``torchstep.explain`` are the public entry
points; this module is their rule book (one method per field group).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from typing import Any

from torchstep.macros import find_macros
from torchstep.names import dns_label, is_env_name
from torchstep.plan import (
    APP_OPTIONS,
    KNOWN_CAPABILITIES,
    MAX_CPU,
    MAX_GPU,
    MAX_MEM_MB,
    MAX_NPROC,
    MAX_REPLICAS,
    MAX_RETRIES,
    RETRY_OWNERS,
    ROLE_OPTIONS,
    TARGETS,
    Decision,
    Mount,
    Port,
    Resources,
    RetryBudget,
    RetryOwner,
    RolePlan,
    SecretRef,
    StepPlan,
    detect_torchrun,
    retry_budget,
)


class _Rejected(Exception):
    """Internal: stop planning a field group after a rejection was recorded."""


class Planner:
    """Walks an AppDef field by field and records a Decision for each (see plan.py)."""

    def __init__(self, app: Any, target: str) -> None:
        self.app = app
        self.target = target
        self.decisions: list[Decision] = []

    # -- recording ------------------------------------------------------------------------
    def ok(self, path: str, value: Any, becomes: str) -> None:
        self.decisions.append(Decision(path, _show(value), "honoured", becomes))

    def ignore(self, path: str, value: Any, why: str) -> None:
        self.decisions.append(Decision(path, _show(value), "ignored", why))

    def reject(self, path: str, value: Any, problem: str, fix: str) -> None:
        self.decisions.append(Decision(path, _show(value), "rejected", problem, fix))

    def fail(self, path: str, value: Any, problem: str, fix: str) -> _Rejected:
        self.reject(path, value, problem, fix)
        return _Rejected()

    @property
    def rejected(self) -> bool:
        return any(d.action == "rejected" for d in self.decisions)

    # -- planning -------------------------------------------------------------------------
    def run(self) -> StepPlan | None:
        from torchx.specs import AppDef

        t = self.target
        if t not in TARGETS:
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
        name = app.name
        if not isinstance(name, str) or not name.strip():
            self.reject("name", name, "the AppDef needs a non-empty name", "set AppDef(name=...)")
            k8s_name = "app"
        else:
            k8s_name = dns_label(name, max_len=40)
            if not k8s_name:
                self.reject(
                    "name",
                    name,
                    "no ASCII letter or digit to derive a Kubernetes-safe name from",
                    "use a name with ASCII letters or digits",
                )
            elif t == "kubernetes" and k8s_name != name:
                self.ok("name", name, f"object name prefix {k8s_name!r} (+ run-unique suffix at run time)")
            else:
                self.ok("name", name, f"app id {name}-<run id>")
        timeout = self.app_metadata(app)
        roles_in = getattr(app, "roles", None)
        if not isinstance(roles_in, list) or not roles_in:
            self.reject("roles", roles_in, "an AppDef needs at least one role", "add a torchx.specs.Role")
            return None
        roles: list[RolePlan] = []
        seen: dict[str, int] = {}
        seen_k8s: dict[str, int] = {}
        for i, role in enumerate(roles_in):
            try:
                rp = self.role(i, role)
            except _Rejected:
                continue
            if rp.name in seen:
                self.reject(
                    f"roles[{i}].name",
                    rp.name,
                    f"duplicate role name (also roles[{seen[rp.name]}])",
                    "give every role a unique name",
                )
                continue
            if rp.k8s_name in seen_k8s and t != "local":
                j = seen_k8s[rp.k8s_name]
                self.reject(
                    f"roles[{i}].name",
                    rp.name,
                    f"maps to the same Kubernetes name {rp.k8s_name!r} as roles[{j}]",
                    "rename one of the roles",
                )
                continue
            seen[rp.name] = i
            seen_k8s[rp.k8s_name] = i
            roles.append(rp)
        self.check_retry_layers(roles)
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

    def app_metadata(self, app: Any) -> float | None:
        timeout: float | None = None
        md = app.metadata if isinstance(app.metadata, dict) else {}
        for key, value in md.items():
            path = f"metadata[{key!r}]"
            if key == "torchstep.timeout":
                timeout = self.seconds(path, value)
                if timeout is not None:
                    self.ok(path, value, f"step timeout {timeout:g} s: every process is stopped after it")
            elif isinstance(key, str) and key.startswith("torchstep."):
                self.reject(path, value, f"unknown torchstep option {key!r}", f"use one of: {', '.join(APP_OPTIONS)}")
            else:
                self.ignore(path, value, "AppDef metadata is informational for torchstep")
        return timeout

    def seconds(self, path: str, value: Any) -> float | None:
        try:
            s = float(value)
        except (TypeError, ValueError):
            self.reject(path, value, "must be a number of seconds", "e.g. 3600")
            return None
        if not (0 < s < 10 * 365 * 86400):
            self.reject(path, value, "must be a positive number of seconds", "e.g. 3600")
            return None
        return s

    def role(self, i: int, role: Any) -> RolePlan:
        from torchx.specs import Role

        p = f"roles[{i}]"
        t = self.target
        if not isinstance(role, Role):
            raise self.fail(
                p, type(role).__name__, "expected a torchx.specs.Role", "build roles with torchx.specs.Role"
            )
        name = role.name
        if not isinstance(name, str) or not name or not name.isprintable() or any(c in name for c in "/\\ \t"):
            raise self.fail(
                f"{p}.name",
                name,
                "a role name must be non-empty, printable, without '/' or spaces",
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
        self.ok(f"{p}.name", name, self.becomes_role(name, k8s_name or name))
        image, workdir = self.image(p, role)
        entrypoint = self.entrypoint(p, role)
        args = self.args(p, role)
        env = self.env(p, role)
        min_r, num_r = self.replicas(p, role)
        opts = self.role_options(p, role)
        uses_torchrun, nproc_detected = detect_torchrun(entrypoint, args)
        nproc = self.nproc(p, opts, nproc_detected, uses_torchrun)
        self.ok(
            f"{p}.entrypoint+args",
            "torchrun" if uses_torchrun else entrypoint,
            f"the role's own torchrun runs under torchstep-agent (shim first on PATH), {nproc} process(es) per replica"
            if uses_torchrun
            else f"wrapped: torchstep-agent --nproc-per-node {nproc} --no-python <entrypoint> <args>",
        )
        resources = self.resources(p, role)
        mounts = self.mounts(p, role)
        ports = self.ports(p, role)
        budget = self.retry(p, role)
        secrets = self.secret_env(p, opts.get("secret_env"), env)
        self.other_metadata(p, role)
        self.nightly_fields(p, role)
        if self.rejected_under(p):
            raise _Rejected()
        return RolePlan(
            name=name,
            k8s_name=k8s_name or dns_label(f"role-{i}"),
            image=image,
            entrypoint=entrypoint,
            args=tuple(args),
            env=env,
            secret_env=secrets,
            min_replicas=min_r,
            num_replicas=num_r,
            nproc_per_node=nproc,
            uses_torchrun=uses_torchrun,
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
            macros=find_macros([*args, *env.values()]),
            metadata=dict(role.metadata) if isinstance(role.metadata, dict) else {},
            workdir=workdir,
        )

    def rejected_under(self, prefix: str) -> bool:
        return any(
            (d.action == "rejected" and (d.field == prefix or d.field.startswith(prefix + ".")))
            or (d.action == "rejected" and d.field.startswith(prefix + "["))
            for d in self.decisions
        )

    def becomes_role(self, name: str, k8s: str) -> str:
        return {
            "local": f"one agent process per replica, logs under <log_dir>/<app_id>/{name}/",
            "kubernetes": f"Pod or Indexed Job + headless Service named {k8s}-<run id>",
            "kfp": f"container component {k8s!r}",
        }[self.target]

    def image(self, p: str, role: Any) -> tuple[str, str | None]:
        image = role.image
        path = f"{p}.image"
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
        if not image or image == "<MISSING>" or any(c.isspace() for c in image):
            raise self.fail(
                path, image, "a container image reference is required", "set Role(image='registry/repo:tag')"
            )
        self.ok(path, image, "container image")
        if getattr(role, "base_image", None):
            self.ignore(f"{p}.base_image", role.base_image, "deprecated in TorchX; the image is used as is")
        return image, None

    def entrypoint(self, p: str, role: Any) -> str:
        ep = role.entrypoint
        if not isinstance(ep, str) or not ep or ep == "<MISSING>" or "\x00" in ep:
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

    def args(self, p: str, role: Any) -> list[str]:
        args = role.args
        if not isinstance(args, list | tuple):
            raise self.fail(f"{p}.args", args, "must be a list of strings", "Role(args=['--lr', '0.1'])")
        for j, a in enumerate(args):
            if not isinstance(a, str):
                self.reject(f"{p}.args[{j}]", a, f"must be a string, got {type(a).__name__}", "convert it with str()")
            elif "\x00" in a:
                self.reject(
                    f"{p}.args[{j}]",
                    a,
                    "contains a NUL byte, which no process argument can carry",
                    "remove the NUL byte",
                )
        if not self.rejected_under(f"{p}.args"):
            self.ok(f"{p}.args", args, "argv list byte for byte (never a shell string); macros bound at run time")
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
                self.reject(path, v, "contains a NUL byte", "remove the NUL byte")
            else:
                out[k] = v
        if env:
            self.ok(
                f"{p}.env",
                {k: "…" for k in env},
                {
                    "local": "merged over the launching process's environment",
                    "kubernetes": "container env",
                    "kfp": "set_env_variable per key",
                }[self.target],
            )
        return out

    def secret_env(self, p: str, spec: Any, env: Mapping[str, str]) -> tuple[SecretRef, ...]:
        if spec is None:
            return ()
        path = f"{p}.metadata['torchstep']['secret_env']"
        if not isinstance(spec, dict):
            raise self.fail(path, spec, "must map ENV_NAME to 'secret-name/key'", "{'HF_TOKEN': 'hf/token'}")
        refs = []
        for env_name, ref in spec.items():
            sub = f"{path}[{env_name!r}]"
            if not isinstance(env_name, str) or not is_env_name(env_name):
                self.reject(sub, env_name, "not a valid environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
                continue
            if env_name in env:
                self.reject(sub, ref, f"{env_name} is also set by value in env", "keep it in one place")
                continue
            secret, sep, key = ref.partition("/") if isinstance(ref, str) else ("", "", "")
            if not sep or not dns_label(secret) == secret or not key:
                self.reject(sub, ref, "must be 'secret-name/key' with a DNS-1123 secret name", "e.g. 'hf-token/token'")
                continue
            refs.append(SecretRef(env_name, secret, key))
            self.ok(
                sub,
                ref,
                {
                    "local": f"read from this process's environment variable {env_name} (must be set)",
                    "kubernetes": "env valueFrom.secretKeyRef (the value never appears in the manifest)",
                    "kfp": "kfp.kubernetes.use_secret_as_env",
                }[self.target],
            )
        if self.target == "local":
            for r in refs:
                if r.env not in os.environ:
                    self.reject(
                        f"{path}[{r.env!r}]",
                        f"{r.secret}/{r.key}",
                        f"the local target reads secrets from the environment, and {r.env} is not set",
                        f"export {r.env} before running, or run on Kubernetes",
                    )
        return tuple(refs)

    def replicas(self, p: str, role: Any) -> tuple[int, int]:
        num = role.num_replicas
        if not isinstance(num, int) or isinstance(num, bool) or not (1 <= num <= MAX_REPLICAS):
            raise self.fail(
                f"{p}.num_replicas", num, f"must be an integer in 1..{MAX_REPLICAS}", "set Role(num_replicas=N)"
            )
        mn = role.min_replicas
        if mn is None:
            mn = num
        elif not isinstance(mn, int) or isinstance(mn, bool) or not (1 <= mn <= num):
            raise self.fail(
                f"{p}.min_replicas",
                mn,
                f"must be an integer in 1..num_replicas ({num})",
                "set min_replicas <= num_replicas, or leave it unset",
            )
        what = {
            "local": f"{num} agent process(es), --nnodes {mn}:{num}" if mn != num else f"{num} agent process(es)",
            "kubernetes": (
                f"Indexed Job, parallelism = completions = {num}, agent --nnodes {mn}:{num}" if num > 1 else "one Pod"
            ),
            "kfp": (f"launcher step submitting an Indexed Job of {num}" if num > 1 else "one container task"),
        }[self.target]
        self.ok(f"{p}.num_replicas", num, what)
        if role.min_replicas is not None:
            self.ok(f"{p}.min_replicas", mn, "elastic minimum: the agent's rendezvous waits for at least this many")
        return mn, num

    def role_options(self, p: str, role: Any) -> dict[str, Any]:
        md = role.metadata if isinstance(role.metadata, dict) else {}
        opts = md.get("torchstep")
        if opts is None:
            return {}
        base = f"{p}.metadata['torchstep']"
        if not isinstance(opts, dict):
            raise self.fail(base, opts, "must be a dict", f"keys: {', '.join(ROLE_OPTIONS)}")
        out: dict[str, Any] = {}
        for k, v in opts.items():
            path = f"{base}[{k!r}]"
            if k not in ROLE_OPTIONS:
                self.reject(path, v, f"unknown torchstep option {k!r}", f"use one of: {', '.join(ROLE_OPTIONS)}")
            elif k == "secret_env":
                out[k] = v
            elif k == "nproc_per_node":
                if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= MAX_NPROC:
                    self.reject(path, v, f"must be an integer in 1..{MAX_NPROC}", "e.g. 2")
                else:
                    out[k] = v
            elif k == "retry_backoff":
                if not isinstance(v, int | float) or isinstance(v, bool) or not 1 <= v <= 100:
                    self.reject(path, v, "must be a number in 1..100", "e.g. 2.0")
                else:
                    out[k] = float(v)
                    self.ok(path, v, "retry delay multiplier of the orchestrator")
            else:
                s = self.seconds(path, v)
                if s is not None:
                    out[k] = s
                    self.ok(path, v, ROLE_OPTIONS[k])
        return out

    def nproc(self, p: str, opts: Mapping[str, Any], detected: int | None, uses_torchrun: bool) -> int:
        if "nproc_per_node" in opts:
            n = int(opts["nproc_per_node"])
            if uses_torchrun and detected is not None and detected != n:
                raise self.fail(
                    f"{p}.metadata['torchstep']['nproc_per_node']",
                    n,
                    f"conflicts with --nproc-per-node {detected} of the role's own torchrun",
                    "set it in one place",
                )
            self.ok(f"{p}.metadata['torchstep']['nproc_per_node']", n, f"agent --nproc-per-node {n}")
            return n
        return detected or 1

    def resources(self, p: str, role: Any) -> Resources:
        from torchx.specs import Resource

        res = role.resource
        path = f"{p}.resource"
        if not isinstance(res, Resource):
            raise self.fail(path, res, "must be a torchx.specs.Resource", "use torchx.specs.Resource(...)")
        t = self.target
        cpu = self.number(f"{path}.cpu", res.cpu, MAX_CPU, allow_float=True)
        gpu = self.number(f"{path}.gpu", res.gpu, MAX_GPU)
        mem = self.number(f"{path}.memMB", res.memMB, MAX_MEM_MB)
        if cpu is not None:
            self.ok(
                f"{path}.cpu",
                cpu,
                {
                    "local": f"CPU affinity of {cpu:g} core(s) per replica and OMP_NUM_THREADS",
                    "kubernetes": f"requests.cpu = limits.cpu = {cpu:g}",
                    "kfp": f"set_cpu_request/limit({cpu:g})",
                }[t],
            )
        if not gpu:
            self.ok(f"{path}.gpu", res.gpu, "no GPU requested")
        if gpu:
            self.ok(
                f"{path}.gpu",
                gpu,
                {
                    "local": f"CUDA_VISIBLE_DEVICES partition of {gpu} GPU(s) per replica (checked at launch)",
                    "kubernetes": f"nvidia.com/gpu: {gpu}",
                    "kfp": f"set_accelerator_limit({gpu})",
                }[t],
            )
        if mem is not None:
            if t == "local":
                self.ignore(f"{path}.memMB", mem, "advisory on the local target: no memory limit is enforced")
            else:
                self.ok(
                    f"{path}.memMB",
                    mem,
                    f"requests.memory = limits.memory = {mem}Mi"
                    if t == "kubernetes"
                    else f"set_memory_request/limit('{mem}M')",
                )
        devices = res.devices if isinstance(res.devices, dict) else None
        if devices is None:
            raise self.fail(f"{path}.devices", res.devices, "must be a dict", "{'vpc.amazonaws.com/efa': 1}")
        for dname, count in devices.items():
            dpath = f"{path}.devices[{dname!r}]"
            if not isinstance(dname, str) or not dname or "/" not in dname:
                self.reject(
                    dpath,
                    dname,
                    "an extended resource name looks like 'vendor.com/device'",
                    "e.g. 'vpc.amazonaws.com/efa'",
                )
                continue
            if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_GPU:
                self.reject(dpath, count, f"must be an integer in 0..{MAX_GPU}", "e.g. 1")
                continue
            if t == "local":
                self.ignore(
                    dpath, count, "extended resources are node hardware; the local target uses what this machine has"
                )
            elif t == "kubernetes":
                self.ok(dpath, count, f"extended resource {dname}: {count} (requests and limits)")
            else:
                self.reject(
                    dpath,
                    count,
                    "KFP v2 cannot request extended resources",
                    "remove it, or run the role with target kubernetes",
                )
        caps = res.capabilities if isinstance(res.capabilities, dict) else None
        if caps is None:
            raise self.fail(
                f"{path}.capabilities",
                res.capabilities,
                "must be a dict",
                "{'node.kubernetes.io/instance-type': 'p4d.24xlarge'}",
            )
        for key, value in caps.items():
            cpath = f"{path}.capabilities[{key!r}]"
            if key not in KNOWN_CAPABILITIES:
                self.reject(
                    cpath,
                    value,
                    f"unknown capability {key!r}",
                    f"use a node label from: {', '.join(sorted(KNOWN_CAPABILITIES))}; or set "
                    "role.metadata['kubernetes'] with a nodeSelector",
                )
            elif t == "local":
                self.ignore(cpath, value, "node selection does not apply on one machine")
            else:
                self.ok(cpath, value, "nodeSelector" if t == "kubernetes" else "add_node_selector")
        for tag_field in ("tags",):  # torchx-nightly only
            tags = getattr(res, tag_field, None)
            if tags:
                self.ignore(f"{path}.{tag_field}", tags, "resource tags are informational for torchstep")
        return Resources(
            cpu=cpu,
            gpu=int(gpu or 0),
            mem_mb=int(mem) if mem is not None else None,
            devices={k: v for k, v in devices.items() if isinstance(v, int) and v > 0},
            capabilities=dict(caps),
        )

    def number(self, path: str, value: Any, limit: int, *, allow_float: bool = False) -> Any:
        """A resource count: -1 (TorchX NULL_RESOURCE) and 0 mean unset; None if unset."""
        ok_types: tuple[type, ...] = (int, float) if allow_float else (int,)
        if isinstance(value, bool) or not isinstance(value, ok_types):
            self.reject(path, value, f"must be {'a number' if allow_float else 'an integer'}", "e.g. 2")
            return None
        value = float(value) if isinstance(value, float) else int(value)
        if value != value or value in (float("inf"), float("-inf")):  # NaN / inf
            self.reject(path, value, "must be a finite number", "e.g. 2")
            return None
        if value == -1 or value == 0:
            return None
        if value < 0:
            self.reject(path, value, "must not be negative (-1 means unset)", "use a positive value or -1")
            return None
        if value > limit:
            self.reject(
                path,
                value,
                f"{value} is more than any node has (limit {limit})",
                "check the unit (memMB is in MiB, cpu in cores)",
            )
            return None
        return value

    def mounts(self, p: str, role: Any) -> list[Mount]:
        from torchx.specs import BindMount, DeviceMount, VolumeMount

        mounts = role.mounts
        if not isinstance(mounts, list | tuple):
            raise self.fail(f"{p}.mounts", mounts, "must be a list", "use torchx.specs.parse_mounts([...])")
        out: list[Mount] = []
        dsts: dict[str, int] = {}
        t = self.target
        if not mounts:
            self.ok(f"{p}.mounts", [], "no mounts")
        for j, m in enumerate(mounts):
            path = f"{p}.mounts[{j}]"
            if isinstance(m, BindMount):
                mount = Mount("bind", m.src_path, m.dst_path, bool(m.read_only))
            elif isinstance(m, VolumeMount):
                mount = Mount("volume", m.src, m.dst_path, bool(m.read_only))
            elif isinstance(m, DeviceMount):
                mount = Mount("device", m.src_path, m.dst_path, "w" not in (m.permissions or ""), m.permissions)
            else:
                self.reject(
                    path,
                    m,
                    f"unknown mount type {type(m).__name__}",
                    "use torchx.specs.BindMount, VolumeMount or DeviceMount",
                )
                continue
            if not isinstance(mount.src, str) or not mount.src or not isinstance(mount.dst, str):
                self.reject(path, m, "mount source and destination must be non-empty strings", "fix the mount")
                continue
            if not mount.dst.startswith("/"):
                self.reject(f"{path}.dst_path", mount.dst, "the destination must be an absolute path", "e.g. /data")
                continue
            if mount.dst in dsts:
                self.reject(
                    f"{path}.dst_path",
                    mount.dst,
                    f"also the destination of mounts[{dsts[mount.dst]}]",
                    "mount each path once",
                )
                continue
            dsts[mount.dst] = j
            ro = " (read-only)" if mount.read_only else ""
            if mount.kind == "device" and mount.permissions and set(mount.permissions) - set("rwm"):
                self.reject(
                    f"{path}.permissions", mount.permissions, "device permissions are a subset of 'rwm'", "e.g. 'rwm'"
                )
                continue
            if t == "local":
                if mount.kind == "volume":
                    self.reject(
                        path,
                        f"{mount.src}->{mount.dst}",
                        "a persistent volume claim does not exist on this machine",
                        "use a BindMount for local runs, or target kubernetes",
                    )
                    continue
                if not mount.src.startswith("/"):
                    self.reject(
                        f"{path}.src_path", mount.src, "a host path must be absolute", "use an absolute host path"
                    )
                    continue
                if mount.src == mount.dst:
                    self.ok(path, f"{mount.src}->{mount.dst}", f"same path on this machine{ro}")
                else:
                    self.ok(
                        path,
                        f"{mount.src}->{mount.dst}",
                        f"{mount.dst} rewritten to {mount.src} in argv and env (no container here){ro}",
                    )
            elif t == "kubernetes":
                self.ok(
                    path,
                    f"{mount.src}->{mount.dst}",
                    {
                        "bind": f"hostPath volume{ro}",
                        "volume": f"persistentVolumeClaim {mount.src}{ro}",
                        "device": "hostPath of the device + privileged securityContext (device cgroup access)",
                    }[mount.kind],
                )
            else:
                if mount.kind == "volume":
                    self.ok(path, f"{mount.src}->{mount.dst}", f"kfp.kubernetes.mount_pvc({mount.src!r}){ro}")
                else:
                    self.reject(
                        path,
                        f"{mount.src}->{mount.dst}",
                        f"KFP v2 has no {'hostPath' if mount.kind == 'bind' else 'device'} mounts",
                        "use a VolumeMount (PVC), or target kubernetes",
                    )
                    continue
            out.append(mount)
        return out

    def ports(self, p: str, role: Any) -> list[Port]:
        pm = role.port_map
        if not isinstance(pm, dict):
            raise self.fail(f"{p}.port_map", pm, "must be a dict of name to port", "{'c10d': 29500}")
        out = []
        for name, port in pm.items():
            path = f"{p}.port_map[{name!r}]"
            if not isinstance(name, str) or not name:
                self.reject(path, name, "a port needs a name", "e.g. 'tensorboard'")
                continue
            if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
                self.reject(path, port, "must be an integer in 1..65535", "e.g. 6006")
                continue
            rdzv = name in RDZV_PORT_NAMES
            if self.target == "local":
                self.ok(
                    path,
                    port,
                    "the rendezvous port: replaced by the launcher's store port"
                    if rdzv
                    else f"checked free at launch, exported as TORCHSTEP_PORT_{_env_suffix(name)}",
                )
            elif self.target == "kubernetes":
                self.ok(path, port, f"containerPort {port} + headless Service port {name!r}")
            else:
                if rdzv:
                    self.ok(path, port, "rendezvous port of the launcher-submitted job")
                else:
                    self.reject(
                        path, port, "KFP v2 cannot expose ports", "remove it, or run the role with target kubernetes"
                    )
                    continue
            out.append(Port(name, port))
        return out

    def retry(self, p: str, role: Any) -> RetryBudget:
        mr = role.max_retries
        if not isinstance(mr, int) or isinstance(mr, bool) or not 0 <= mr <= MAX_RETRIES:
            raise self.fail(f"{p}.max_retries", mr, f"must be an integer in 0..{MAX_RETRIES}", "e.g. 2")
        pol = role.retry_policy
        name = pol.name if isinstance(pol, enum.Enum) else pol
        if name not in RETRY_OWNERS:
            raise self.fail(
                f"{p}.retry_policy", pol, f"unknown retry policy {pol!r}", f"use one of: {', '.join(RETRY_OWNERS)}"
            )
        budget = retry_budget(name, mr)
        self.ok(f"{p}.max_retries", mr, f"retry budget owned by: {budget.owner.value}")
        what = {
            RetryOwner.NONE: "no retries",
            RetryOwner.ORCHESTRATOR: {
                "local": f"{mr} retries of the whole app by the caller (orchestrator, or `torchstep run`)",
                "kubernetes": f"{mr} retries of the whole step by the orchestrator; Job backoffLimit 0, agent 0",
                "kfp": f"set_retry({mr}) on the task; agent restarts 0",
            }[self.target],
            RetryOwner.AGENT: {
                "local": f"agent --max-restarts {mr}; a lost replica is replaced from the same budget",
                "kubernetes": f"agent --max-restarts {mr}; lost pods replaced via backoffLimitPerIndex; "
                "podFailurePolicy fails the Job on the agent's final exit codes",
                "kfp": f"agent --max-restarts {mr} inside the step; no set_retry",
            }[self.target],
            RetryOwner.ROLE: {
                "local": f"{mr} restarts of every replica of the role by the launcher",
                "kubernetes": f"Job backoffLimit {mr} for the role (every replica restarts)",
                "kfp": f"{mr} restarts of the role's Job by the launcher step",
            }[self.target],
        }[budget.owner]
        if name == "HOT_SPARE":
            what += " (HOT_SPARE: spares beyond min_replicas join the elastic rendezvous)"
        self.ok(f"{p}.retry_policy", name, what)
        return budget

    def check_retry_layers(self, roles: list[RolePlan]) -> None:
        owners: dict[RetryOwner, RolePlan] = {}
        for r in roles:
            if r.retry.owner is not RetryOwner.NONE:
                owners.setdefault(r.retry.owner, r)
        if RetryOwner.ORCHESTRATOR in owners and len(owners) > 1:
            a = owners[RetryOwner.ORCHESTRATOR]
            b = next(r for o, r in owners.items() if o is not RetryOwner.ORCHESTRATOR)
            i = roles.index(b)
            self.reject(
                f"roles[{i}].retry_policy",
                b.retry.policy,
                f"role {a.name!r} retries the whole step ({a.retry.policy}, {a.retry.count}) while role "
                f"{b.name!r} retries itself ({b.retry.policy}, {b.retry.count}): one failure of "
                f"{b.name!r} would be retried by two layers",
                "use one retry policy for every role, or set max_retries=0 on one of them",
            )

    def other_metadata(self, p: str, role: Any) -> None:
        md = role.metadata if isinstance(role.metadata, dict) else None
        if md is None:
            raise self.fail(f"{p}.metadata", role.metadata, "must be a dict", "Role(metadata={...})")
        for key, value in md.items():
            path = f"{p}.metadata[{key!r}]"
            if key == "torchstep":
                continue
            if key == "kubernetes":
                if not isinstance(value, dict):
                    self.reject(path, value, "must be a partial pod spec (dict)", "{'nodeSelector': {...}}")
                elif self.target == "local":
                    self.ignore(path, value, "a pod spec overlay has no meaning on one machine")
                elif self.target == "kubernetes":
                    self.ok(path, value, "merged into the rendered pod spec (TorchX nightly convention)")
                else:
                    self.ok(
                        path,
                        value,
                        "mapped to kfp-kubernetes calls where expressible (else a SpecError from the KFP adapter)",
                    )
            else:
                self.ignore(path, value, "metadata for other tools; torchstep reads 'torchstep' and 'kubernetes'")

    def nightly_fields(self, p: str, role: Any) -> None:
        ws = getattr(role, "workspace", None)
        if ws:
            self.reject(
                f"{p}.workspace",
                ws,
                "torchstep runs the image as is and does not build workspaces",
                "bake the code into the image, or use a directory image on the local target",
            )
        ov = getattr(role, "overrides", None)
        if ov:
            self.reject(
                f"{p}.overrides",
                ov,
                "scheduler request overrides are TorchX-scheduler specific",
                "use role.metadata['kubernetes'] for pod spec changes",
            )


RDZV_PORT_NAMES = frozenset({"c10d", "rdzv", "rendezvous", "master"})


def _env_suffix(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).upper()


def _show(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= 200 else text[:197] + "..."
