"""Rules for a role's identity and command: ``Role.name``, ``image``, ``base_image``,
``entrypoint``, ``args``, ``env`` and the TorchX macros they use. Part of the rule book
behind :func:`torchstep.build_plan`.

Example::

    >>> from torchx.specs import Role
    >>> rec = Recorder(app=None, target="kubernetes")
    >>> role_entrypoint(rec, "roles[0]", Role("t", image="img", entrypoint="python"))
    'python'
    >>> rec.decisions[0].becomes
    'container args after the agent (command = torchstep-agent)'
"""

from __future__ import annotations

import os
from typing import Any

from torchstep.plan.macros import RANK0_ENV_VAR
from torchstep.plan.names import dns_label, is_env_name
from torchstep.plan.rules.record import Recorder, Wording

#: Role names become DNS labels of at most this many characters (object names add a suffix).
ROLE_NAME_MAX = 30
#: Public images known to lack torchstep (repositories, any tag): TorchX's default image,
#: which its builtins (``dist.ddp``, ``utils.*``) name unless given ``--image``, and the
#: official PyTorch and Python images. A step needs ``torchstep[agent]`` in its image.
IMAGES_WITHOUT_TORCHSTEP = frozenset({"ghcr.io/pytorch/torchx", "pytorch/pytorch", "python"})
_MISSING = "<MISSING>"  # torchx.specs.MISSING
_SHELL_CHARS = frozenset(";&|$`'\"<>()*?[]{}!#~")

#: What a role's identity and command become on each target.
BECOMES: dict[str, Wording] = {
    "name": {
        "local": "one agent process per replica, logs under <log_dir>/<app id>/{name}/",
        "kubernetes": "Pod or Indexed Job + headless Service named {k8s_name}-<run id>",
        "kfp": "role {k8s_name!r} of the step component (component_from_fn/app); its Job's name on a launcher step",
    },
    "image": {
        "local": "working directory of every process (as TorchX local_cwd)",
        "kubernetes": "container image",
        "kfp": "ContainerSpec image (fixed at compile time; a launcher step's pods take the run-time one)",
    },
    # what happens to an image that is a path of this machine (`image="."`), and what to do
    "image_is_a_path": {
        "local": "",
        "kubernetes": "{image!r} is a path on this machine, not an image a cluster can pull: every pod would "
        "stay in InvalidImageName and the step would never start",
        "kfp": "{image!r} is a path on this machine, not an image a cluster can pull: kfp.local's "
        "SubprocessRunner runs the step here (the directory is its working directory), but on a KFP "
        "cluster the step's pod never starts (InvalidImageName)",
    },
    "image_is_a_path_fix": {
        "local": "",
        "kubernetes": 'build an image with your code and `pip install "torchstep[agent]"`, push it, and pass '
        "its reference (registry/repo:tag) as the image",
        "kfp": 'for a cluster: build an image with your code and `pip install "torchstep[agent]" torchstep-kfp`, '
        "push it, and pass its reference (registry/repo:tag) as the image",
    },
    # an image known to lack torchstep (TorchX's default image, the official PyTorch image)
    "image_without_torchstep": {
        "local": "",
        "kubernetes": "{image!r} has no torchstep: the pods would start and fail at once (their command "
        "`python -m torchstep.launch` needs `torchstep[agent]` in the image)",
        "kfp": "{image!r} has no torchstep: the step's container would fail at once (it runs "
        "`python3 -m torchstep_kfp.entry`)",
    },
    "image_without_torchstep_fix": {
        "local": "",
        "kubernetes": 'build an image FROM it with `pip install "torchstep[agent]"` and pass it (the '
        "component's image argument, e.g. `--image registry/repo:tag`, or `torchstep render --image`)",
        "kfp": 'build an image FROM it with `pip install "torchstep[agent]" torchstep-kfp` and pass it '
        "(the component's image argument, e.g. component_from_fn(..., image='registry/repo:tag'))",
    },
    "entrypoint": {
        "local": "argv[0] of every worker (run by the agent, no shell)",
        "kubernetes": "container args after the agent (command = torchstep-agent)",
        "kfp": "argv[0] of every worker, run by the agent inside the step (python3 -m torchstep_kfp.entry)",
    },
    "args": {
        "local": "argv list byte for byte (never a shell string); macros bound at launch",
        "kubernetes": "container args byte for byte (never a shell string); macros bound in the pod",
        "kfp": "byte for byte in the step spec (JSON; never a shell string or a KFP placeholder); macros bound in the step",
    },
    "env": {
        "local": "merged over the launching process's environment",
        "kubernetes": "container env (values in the manifest; use secret_env for secrets)",
        "kfp": "set_env_variable per key (values in the pipeline spec; use secret_env for secrets)",
    },
    "app_id": {
        "local": "app_id = <app>-<run id>",
        "kubernetes": "app_id = the run-unique object name",
        "kfp": "app_id = <app>-<hash of the KFP run id and the pod name>: new per run, task and retry",
    },
    "replica_id": {
        "local": "replica_id = 0..N-1 per agent",
        "kubernetes": "replica_id = JOB_COMPLETION_INDEX",
        "kfp": "replica_id = 0 (one container), the Job index on a launcher step",
    },
    "rank0_env": {
        "local": "rank0_env = {var} (holds the host of replica 0)",
        "kubernetes": "rank0_env = {var} (holds the host of replica 0)",
        "kfp": "rank0_env = {var} (holds the host of replica 0)",
    },
    "img_root": {
        "local": "img_root = the image directory (or the current directory)",
        "kubernetes": "img_root = '' (as TorchX)",
        "kfp": "img_root = '' (as TorchX)",
    },
    "base_img_root": {
        "local": "base_img_root = the image directory (or the current directory)",
        "kubernetes": "base_img_root = ''",
        "kfp": "base_img_root = ''",
    },
}


def role_name(rec: Recorder, p: str, i: int, role: Any) -> tuple[str, str]:
    name = role.name
    t = rec.target
    if not isinstance(name, str) or not name or not name.isprintable() or any(c in name for c in "/\\ "):
        raise rec.fail(
            f"{p}.name",
            name,
            "a role name must be non-empty, printable, without '/', '\\' or spaces",
            "use e.g. 'trainer'",
        )
    if name.startswith("-") or any(c in _SHELL_CHARS for c in name):
        # it names directories and appears on the agent's command line: an option-like
        # or shell-like name would be read as something else there
        raise rec.fail(
            f"{p}.name",
            name,
            "a role name may not start with '-' or contain shell characters such as ; $ ` ' \" | & < > ( ) * ?",
            "use letters, digits, '-', '_' and '.', e.g. 'trainer'",
        )
    if name in (".", ".."):
        raise rec.fail(f"{p}.name", name, "'.' and '..' cannot name a role", "use e.g. 'trainer'")
    k8s_name = dns_label(name, max_len=ROLE_NAME_MAX)
    if not k8s_name and t != "local":
        raise rec.fail(
            f"{p}.name",
            name,
            "no ASCII letter or digit to derive a Kubernetes-safe name from",
            "use a role name with ASCII letters or digits",
        )
    k8s_name = k8s_name or f"role-{i}"
    rec.ok(f"{p}.name", name, rec.on_target(BECOMES["name"], name=name, k8s_name=k8s_name))
    return name, k8s_name


def role_image(rec: Recorder, p: str, role: Any) -> tuple[str, str | None]:
    image = role.image
    path = f"{p}.image"
    base = getattr(role, "base_image", None)
    if base:
        rec.ignore(f"{p}.base_image", base, "deprecated in TorchX; the image is used as is")
    else:
        rec.ok(f"{p}.base_image", base, "unset (deprecated TorchX field)")
    if not isinstance(image, str):
        raise rec.fail(path, image, "must be a string", "set Role(image=...)")
    if rec.target == "local":
        if image and os.path.isdir(image):
            rec.ok(path, image, rec.on_target(BECOMES["image"]))
            return image, os.path.abspath(image)
        rec.ignore(
            path,
            image,
            "not a directory: the local target runs on this machine's environment "
            "(a directory image becomes the working directory)",
        )
        return image, None
    if not image or image == _MISSING or not image.isprintable() or any(c.isspace() for c in image):
        raise rec.fail(path, image, "a container image reference is required", "set Role(image='registry/repo:tag')")
    if image.startswith((".", "/", "~")):  # ".", "..", "/abs", "./dir", "~/dir": never an image reference
        # Kubernetes: rendered objects only run on a cluster, which can never pull it. KFP: the
        # same on a cluster, but kfp.local's SubprocessRunner runs the step on this machine,
        # where the directory is the working directory (the tutorial's local run).
        problem = rec.on_target(BECOMES["image_is_a_path"], image=image)
        fix = rec.on_target(BECOMES["image_is_a_path_fix"])
        if rec.target == "kubernetes":
            raise rec.fail(path, image, problem, fix)
        rec.warn(path, image, problem, fix)
        return image, None
    if image_repository(image) in IMAGES_WITHOUT_TORCHSTEP:
        problem = rec.on_target(BECOMES["image_without_torchstep"], image=image)
        rec.warn(path, image, problem, rec.on_target(BECOMES["image_without_torchstep_fix"]))
        return image, None
    rec.ok(path, image, rec.on_target(BECOMES["image"]))
    return image, None


def image_repository(image: str) -> str:
    """The repository of an image reference, without tag, digest or Docker Hub's default
    registry and ``library/`` namespace.

    >>> image_repository("docker.io/library/python:3.11@sha256:abc"), image_repository("ghcr.io/pytorch/torchx:0.7.0")
    ('python', 'ghcr.io/pytorch/torchx')
    >>> image_repository("localhost:5000/train")
    'localhost:5000/train'
    """
    name = image.partition("@")[0]
    head, sep, tag = name.rpartition(":")
    if sep and "/" not in tag:
        name = head
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.removeprefix("library/")


def role_entrypoint(rec: Recorder, p: str, role: Any) -> str:
    ep = role.entrypoint
    if not isinstance(ep, str) or not ep or ep == _MISSING or "\x00" in ep:
        raise rec.fail(f"{p}.entrypoint", ep, "an entrypoint is required", "set Role(entrypoint='python')")
    rec.ok(f"{p}.entrypoint", ep, rec.on_target(BECOMES["entrypoint"]))
    return ep


def role_args(rec: Recorder, p: str, role: Any) -> list[Any]:
    args = role.args
    if not isinstance(args, list | tuple):
        raise rec.fail(f"{p}.args", args, "must be a list of strings", "Role(args=['--lr', '0.1'])")
    for j, a in enumerate(args):
        if not isinstance(a, str):
            rec.reject(f"{p}.args[{j}]", a, f"must be a string, got {type(a).__name__}", "convert it with str()")
        elif "\x00" in a:
            rec.reject(f"{p}.args[{j}]", a, "contains a NUL byte, which no process argument can carry", "remove it")
    if not rec.rejected_under(f"{p}.args"):
        rec.ok(f"{p}.args", list(args), rec.on_target(BECOMES["args"]))
    return list(args)


def role_env(rec: Recorder, p: str, role: Any) -> dict[str, str]:
    env = role.env
    if not isinstance(env, dict):
        raise rec.fail(f"{p}.env", env, "must be a dict of strings", "Role(env={'KEY': 'value'})")
    out: dict[str, str] = {}
    for k, v in env.items():
        path = f"{p}.env[{k!r}]"
        if not isinstance(k, str) or not is_env_name(k):
            rec.reject(path, k, "not a valid environment variable name", "use [A-Za-z_][A-Za-z0-9_]*")
        elif not isinstance(v, str):
            rec.reject(path, v, f"value must be a string, got {type(v).__name__}", "convert it with str()")
        elif "\x00" in v:
            rec.reject(path, "…", "contains a NUL byte, which no environment value can carry", "remove it")
        else:
            out[k] = v
    names_only = {k: "…" for k in env}  # values may be secrets
    rec.ok(f"{p}.env", names_only, rec.on_target(BECOMES["env"]) if env else "none")
    return out


def becomes_macros(rec: Recorder, macros: frozenset[Any]) -> str:
    """The row of a role's macros: how each one is bound on the target."""
    if not macros:
        return "none used"
    bound = [rec.on_target(BECOMES[m.value], var=RANK0_ENV_VAR) for m in sorted(macros)]
    return "bound per replica at run time: " + ", ".join(bound)
