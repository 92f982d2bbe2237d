"""The policy's vocabulary: :class:`PolicyError`, who may set each run option, and how
names, host paths and image references are compared (normalised first, so ``/data/../etc``,
``/data2`` and ``docker.io/x`` mean what the kernel and the container runtime make of them).

Example::

    >>> norm_path("/data/./x/../../etc/"), under("/data2", ("/data",)), under("/data/x", ("/data/",))
    ('/etc', False, True)
    >>> image_ref("python:3.11"), image_allowed("docker.io/library/python", ("python",))
    (('docker.io/library/python', ':3.11'), True)
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
import re
from typing import Any

from torchstep.errors import SpecError

#: The environment variable naming the deployment's policy file (a served flow, a worker).
ENV_POLICY = "TORCHSTEP_POLICY"
#: ``overlay``: ``unprivileged`` refuses host-level and privilege fields (and checks images,
#: service accounts, Secrets, claims and env names in it like the AppDef's own);
#: ``none`` refuses any overlay; ``any`` trusts the overlay entirely.
OVERLAY_MODES = ("unprivileged", "none", "any")
#: Environment variables that load code, start programs, redirect what torchstep's own
#: processes read or write, or reach devices (the default ``env_denied``). A deny-list is
#: never complete: docs/security.md says what this denial is and is not.
DEFAULT_ENV_DENIED = (
    # the dynamic loader and libc
    "LD_*",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    # Python: import paths, startup code, hooks that import a module named by the variable
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONWARNINGS",
    "PYTHONBREAKPOINT",
    "PYTHONINSPECT",
    "PYTHONEXECUTABLE",
    "PYTHONPYCACHEPREFIX",
    "PYTHONPLATLIBDIR",
    "HOME",
    "IPYTHONDIR",
    # shells: startup files, xtrace prompts that run commands, exported functions, lookup paths
    "BASH_ENV",
    "ENV",
    "PATH",
    "SHELLOPTS",
    "BASHOPTS",
    "PS4",
    "PROMPT_COMMAND",
    "BASH_FUNC_*",
    "BASH_XTRACEFD",
    "BASH_LOADABLES_PATH",
    "CDPATH",
    "GLOBIGNORE",
    "IFS",
    "ZDOTDIR",
    # other runtimes
    "NODE_OPTIONS",
    "NODE_PATH",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "PERL5DB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "CLASSPATH",
    "LUA_INIT*",
    "LUA_PATH*",
    "LUA_CPATH*",
    # torch, compilers and their caches of compiled code
    "TORCH_EXTENSIONS_DIR",
    "TORCH_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_LOGS_OUT",
    "TRITON_*_DIR",
    "TRITON_*_PATH",
    "TRITON_HOME",
    "CUDA_INJECTION*",
    "CUDA_CACHE_PATH",
    "CUDA_HOME",
    "CUDA_PATH",
    # communication libraries' plugins and the files they read or write
    "NCCL_*_PLUGIN",
    "NCCL_*_FILE",
    "OMPI_MCA_*",
    "OPAL_PREFIX",
    "PMIX_MCA_*",
    "PRTE_MCA_*",
    "FI_PROVIDER_PATH",
    "UCX_MODULE_DIR",
    "OPENSSL_CONF",
    "OPENSSL_ENGINES",
    "OPENSSL_MODULES",
    "KUBECONFIG",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_EXEC_PATH",
    "GIT_CONFIG*",
    "GIT_ASKPASS",
    "GIT_PROXY_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "GIT_TEMPLATE_DIR",
    "GIT_DIR",
    # devices outside the pod's allocation (nvidia-container-runtime reads NVIDIA_VISIBLE_DEVICES=all)
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_REQUIRE_*",
    "NVIDIA_DISABLE_REQUIRE",
    "NVIDIA_MIG_*",
    "NVIDIA_IMEX_CHANNELS",
    # what the agent and torchrun read: its flags, files, stores and interpreter
    "PET_*",
    "TORCHELASTIC_*",
    "TORCHSTEP_*_FILE",
    "TORCHSTEP_*_DIR",
    "TORCHSTEP_RDZV_*",
    "TORCHSTEP_ZYGOTE*",
    "TORCHSTEP_PYTHON",
    "TORCHSTEP_LAUNCH_TOKEN",
    "TORCHSTEP_TERMINATION_LOG",
    "TORCHSTEP_PLAN_CACHE",
    "TORCHSTEP_POLICY",
    "TORCHSTEP_*_ENDPOINT",
    "TORCHSTEP_LAST_CHECKPOINT",
)
#: Extended resources a network AppDef may request when the deployment lists none
#: (``extended_resources``): whole GPUs and the EFA network devices TorchX's AWS named resources use.
DEFAULT_EXTENDED_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "vpc.amazonaws.com/efa")
#: Extended resources that are GPUs or accelerators under another name (``gpu_resources``):
#: each unit counts against the policy's ``gpu`` limit, like ``Resource.gpu``.
DEFAULT_GPU_RESOURCES = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.*",
    "nvidia.com/mig-*",
    "nvidia.com/*gpu*",
    "amd.com/gpu",
    "amd.com/*gpu*",
    "gpu.intel.com/*",
    "habana.ai/*",
    "aws.amazon.com/neuron*",
    "google.com/tpu",
    "cloud-tpus.google.com/*",
)
#: Volume kinds an overlay may use (``volume_sources``); claims, Secrets, projected tokens
#: and ephemeral claim templates in them are still checked.
DEFAULT_VOLUME_SOURCES = (
    "emptyDir",
    "configMap",
    "downwardAPI",
    "ephemeral",
    "persistentVolumeClaim",
    "secret",
    "projected",
)
#: Pod spec fields an overlay may set as it likes (``pod_fields``). The fields torchstep checks
#: itself (service account, volumes, containers, pull Secrets, priority class, resources,
#: ``terminationGracePeriodSeconds``, ``automountServiceAccountToken``, the host namespaces)
#: are checked whatever this list says; ``resourceClaims`` (devices by dynamic resource
#: allocation), ``securityContext``, ``nodeName`` and ``runtimeClassName`` are refused unless listed.
DEFAULT_POD_FIELDS = (
    "activeDeadlineSeconds",
    "affinity",
    "dnsConfig",
    "dnsPolicy",
    "enableServiceLinks",
    "hostAliases",
    "hostname",
    "hostUsers",
    "nodeSelector",
    "os",
    "overhead",
    "preemptionPolicy",
    "readinessGates",
    "restartPolicy",
    "schedulerName",
    "schedulingGates",
    "setHostnameAsFQDN",
    "shareProcessNamespace",
    "subdomain",
    "tolerations",
    "topologySpreadConstraints",
)
#: The deepest nesting of a request from the network (an AppDef is about 12 levels deep):
#: deeper data is refused before it is parsed.
MAX_NESTING = 64

# Run options per target: who may set each in a network-borne cfg.
#   free:   any value (the target checks it)
#   option: only when the policy lists it in `options` (it changes what the step may use)
#   entry:  never (the entry point sets it)
#   and the value-checked ones: namespace, service_account, secrets, path, inherit_env
CFG_RULES: dict[str, dict[str, str]] = {
    "local": {
        "log_dir": "path",
        "checkpoint_dir": "path",
        "run_id": "entry",
        "inherit_env": "inherit_env",
        "gpus": "option",
        "retries": "free",
        "retry_delay": "free",
        "grace_period": "free",
        "timeout": "free",
        "cpu_affinity": "free",
        "tee": "free",
    },
    "kubernetes": {
        "namespace": "namespace",
        "service_account": "service_account",
        "image_pull_secrets": "secrets",
        "run_id": "entry",
        "result_file": "entry",
        "priority_class": "option",
        "queue": "option",
        "labels": "option",
        "annotations": "option",
        "image_pull_policy": "free",
        "ttl_seconds_after_finished": "free",
        "active_deadline": "free",
        "pod": "free",
        "shm_size": "free",
        "rdzv_port": "free",
        "join_timeout": "free",
        "cluster_domain": "free",
        "store_takeover": "free",
        "store_witness": "free",
        "preemption_retries": "free",
    },
}
#: Annotations that lift a container's confinement (refused unless ``overlay = "any"``).
PRIVILEGE_ANNOTATIONS = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)


class PolicyError(SpecError):
    """A field of a network-borne AppDef, target or run option that the deployment's
    policy does not allow; ``field`` is its path (``app.roles[0].mounts[1].src_path``,
    ``cfg['namespace']``), ``fix`` says what the policy allows.

    Args:
        field: the refused field's path (``app.roles[0].mounts[1].src_path``, ``cfg['namespace']``).
        target: the target the AppDef was sent for; ``None`` for an error in the policy itself.
        problem: what the policy does not allow.
        fix: what the policy allows instead.
    """

    def __reduce__(self):  # keep pickling (Airflow, Prefect) working: a PolicyError stays one
        return (_rebuild_policy_error, (self.field, self.target, self.problem, self.fix))


def _rebuild_policy_error(field: str, target: str | None, problem: str, fix: str | None) -> PolicyError:
    return PolicyError(field, target, problem, fix=fix)


#: What a step gets when its request names no namespace or service account: the kubernetes
#: target's default namespace and Kubernetes' own service account. Naming them is always
#: allowed (it asks for nothing the deployment does not already give).
DEPLOYMENT_OWN = {"namespace": "default", "service_account": "default"}


def named(name: str, allowed: tuple[str, ...]) -> bool:
    """Whether ``name`` matches one of ``allowed`` (names or ``fnmatch`` patterns, case-sensitive).

    Args:
        name: a namespace, service account, Secret or claim name.
        allowed: the policy's list.
    """
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed)


def listed(values: tuple[str, ...]) -> str:
    """A policy list as the fix of an error says it (``none`` when empty).

    Args:
        values: the policy's list.
    """
    return ", ".join(values) if values else "none"


def norm_path(value: Any) -> str | None:
    """An absolute path, normalised lexically (``..``, ``.``, ``//`` and trailing ``/`` gone).

    Args:
        value: anything; only an absolute path string normalises.

    Returns:
        The path, or ``None`` when ``value`` is not an absolute path (or holds a NUL).
    """
    if not isinstance(value, str) or not value.startswith("/") or "\x00" in value:
        return None
    return "/" + posixpath.normpath(value).lstrip("/")


def under(path: str, prefixes: tuple[str, ...], *, real: bool = False) -> bool:
    """Whether ``path`` is one of ``prefixes`` or below one, compared whole component by
    component (``/data`` covers ``/data/x``, not ``/data2``).

    Args:
        path: a normalised absolute path (:func:`norm_path`).
        prefixes: the policy's path prefixes.
        real: also compare with each prefix's real path (symlinks resolved on this machine).
    """
    for prefix in prefixes:
        norm = norm_path(prefix)
        if norm is None:
            continue
        for base in (norm, os.path.realpath(norm)) if real else (norm,):
            if base == "/" or path == base or path.startswith(base + "/"):
                return True
    return False


_DOMAIN = re.compile(r"^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*(?::[0-9]+)?$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$")


def image_ref(ref: str, *, namespace: bool = False) -> tuple[str, str] | None:
    """``(repository, tag-or-digest suffix)`` of an image reference, normalised as the
    container runtime resolves it (``python`` → ``docker.io/library/python``); ``None`` if it
    is not a valid reference. ``namespace``: ``ref`` names a registry path (``docker.io/acme``),
    not one repository, so Docker Hub's ``library/`` is not added.

    Args:
        ref: the image reference (``python:3.11``, ``ghcr.io/acme/train@sha256:...``).
        namespace: whether ``ref`` names a registry path rather than one repository.
    """
    rest, _, digest = ref.partition("@")
    if digest and not _DIGEST.match(digest):
        return None
    head, _, last = rest.rpartition("/")
    name, _, tag = last.partition(":")
    if tag and not _TAG.match(tag):
        return None
    parts = [*(head.split("/") if head else []), name]
    first = parts[0].lower()
    if len(parts) > 1 and ("." in first or ":" in first or first == "localhost"):
        domain, path = ("docker.io" if first == "index.docker.io" else first), parts[1:]
    else:
        domain, path = "docker.io", parts
    if not _DOMAIN.match(domain) or not all(_COMPONENT.match(p) for p in path):
        return None
    if domain == "docker.io" and len(path) == 1 and not namespace:
        path = ["library", *path]
    suffix = (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")
    return f"{domain}/{'/'.join(path)}", suffix


def image_allowed(image: str, prefixes: tuple[str, ...]) -> bool:
    """Whether the policy's ``images`` allow ``image``: a repository equal to an entry (its
    tag or digest too, when the entry has one), under an entry ending in ``/``, or (local
    target) a directory under an absolute path entry.

    Args:
        image: the role's image.
        prefixes: the policy's ``images``.
    """
    if image.startswith("/"):  # a directory image (local target)
        norm = norm_path(image)
        return norm is not None and under(norm, tuple(p for p in prefixes if p.startswith("/")))
    ref = image_ref(image)
    if ref is None:
        return False
    repo, suffix = ref
    for entry in prefixes:
        if entry.startswith("/"):
            continue
        if entry.endswith("/"):  # every repository under a registry or a registry path
            stripped = entry.rstrip("/").lower()
            if "/" not in stripped and ("." in stripped or ":" in stripped or stripped == "localhost"):
                base: tuple[str, str] | None = ("docker.io" if stripped == "index.docker.io" else stripped, "")
            else:
                base = image_ref(entry.rstrip("/"), namespace=True)
            if base is not None and not base[1] and repo.startswith(base[0] + "/"):
                return True
            continue
        allowed = image_ref(entry)
        if allowed is None:
            continue
        if allowed[1]:  # a pinned tag or digest: that one only
            if repo + suffix == allowed[0] + allowed[1] or (repo + suffix).startswith(allowed[0] + allowed[1] + "@"):
                return True
        elif repo == allowed[0] or repo.startswith(allowed[0] + "/"):
            return True
    return False
