"""The kubernetes target's run options, declared as a TorchX ``runopts`` (typed, with
defaults and help; ``torchstep runopts kubernetes`` prints them).

Example::

    >>> from torchstep.kubernetes.options import resolve
    >>> opts = resolve({"queue": "team-a", "labels": "team:ml;tier:batch"})
    >>> (opts.namespace, opts.queue, opts.labels)
    ('default', 'team-a', {'team': 'ml', 'tier': 'batch'})
    >>> resolve({"queue": "Team A"})
    Traceback (most recent call last):
    ...
    torchstep.errors.SpecError: cfg['queue'] (target 'kubernetes'): 'Team A' is not a valid label value; fix: ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchstep.errors import SpecError
from torchstep.plan import names
from torchstep.plan.agent_command import DEFAULT_RDZV_PORT
from torchstep.plan.options import parse_options, to_runopts

TARGET = "kubernetes"

#: Label Kueue reads to put a Job (or a bare Pod) into a LocalQueue.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Default of the ``preemption_retries`` run option.
DEFAULT_PREEMPTION_RETRIES = 10
#: ``imagePullPolicy`` values.
PULL_POLICIES = ("Always", "IfNotPresent", "Never")

# name -> (type, default, help). The single source for cfg_table() and KubernetesOptions.
_OPTS: dict[str, tuple[Any, Any, str]] = {
    "namespace": (str, "default", "namespace of every object"),
    "run_id": (
        str,
        None,
        "the orchestrator's run id: object names end in a hash of it (the same id gives the same names, "
        "so make it unique per attempt); default: a fresh random id",
    ),
    "service_account": (str, None, "serviceAccountName of every pod"),
    "image_pull_secrets": (list, None, "Secrets to pull images with, ';'-separated"),
    "image_pull_policy": (str, None, f"imagePullPolicy: {' | '.join(PULL_POLICIES)} (default: Kubernetes')"),
    "priority_class": (str, None, "priorityClassName of every pod"),
    "queue": (
        str,
        None,
        f"Kueue LocalQueue: label {QUEUE_LABEL} on every Job and bare Pod; Jobs are created suspended "
        "and start when Kueue admits them (the wait is not counted against the step's timeout)",
    ),
    "preemption_retries": (
        int,
        DEFAULT_PREEMPTION_RETRIES,
        "how many times the step's pods may be taken away (DisruptionTarget: drain, preemption, a Kueue "
        "eviction) and replaced, resuming from the step's checkpoint, before the step ends PREEMPTED; "
        "never counted against the step's retries",
    ),
    "labels": (dict, None, "extra labels on every object and pod: key:value;key2:value2"),
    "annotations": (dict, None, "extra annotations on every object and pod: key:value;key2:value2"),
    "ttl_seconds_after_finished": (int, None, "Jobs (and their pods) are deleted this long after they finish"),
    "active_deadline": (
        int,
        None,
        "seconds a role may run before Kubernetes stops it and fails it; the smallest of this, "
        "app metadata torchstep.timeout and role metadata torchstep.timeout wins",
    ),
    "pod": (
        bool,
        None,
        "1-replica roles: true = a bare Pod (what KubernetesPodOperator runs), false = an Indexed Job of 1; "
        "default: a Pod, unless the role's retries need the Job controller (REPLICA or ROLE with max_retries > 0)",
    ),
    "shm_size": (str, None, "sizeLimit of the /dev/shm memory volume, e.g. 8Gi (default: the pod's memory limit)"),
    "rdzv_port": (int, DEFAULT_RDZV_PORT, "rendezvous port of multi-replica roles (a port_map entry c10d wins)"),
    "join_timeout": (
        int,
        900,
        "seconds a replica waits in the rendezvous for its peers (pods may start minutes apart: "
        "scheduling, node scale-up, image pulls)",
    ),
    "cluster_domain": (str, "cluster.local", "the cluster's DNS domain (part of replica 0's FQDN)"),
    "store_takeover": (
        bool,
        True,
        "elastic multi-replica roles (--nnodes min:max): when replica 0's agent dies (its pod deleted or "
        "OOM-killed), or its node goes silent while the other replicas are a majority, the c10d rendezvous "
        "store moves to the lowest-ranked surviving replica and the others train on without their pods being "
        "replaced; replica 0 (or its replacement) joins them there. An even split (two replicas, one cut off) "
        "is decided by the run's Lease (the pods' service account needs get/create/update on leases). False: "
        "torchrun's way (the store stays in replica 0, whose loss replaces every pod)",
    ),
    "store_witness": (
        bool,
        True,
        "with store_takeover: an even split (two replicas, one partitioned) is decided by the run's Lease "
        "(coordination.k8s.io, torchstep-store-<job>), which the pods' service account must be allowed to get, "
        "create and update; False: an even split keeps the store in replica 0 (and no Lease is read)",
    ),
    "result_file": (
        str,
        None,
        "absolute path in the container where the agent writes the step result "
        "(e.g. /airflow/xcom/return.json for KubernetesPodOperator's do_xcom_push)",
    ),
}


def cfg_table() -> Any:
    """The kubernetes target's options as a ``torchx.specs.runopts``.

    >>> print(cfg_table())  # doctest: +ELLIPSIS
        usage:
            [namespace=NAMESPACE],...
    """
    return to_runopts(_OPTS)


@dataclass(frozen=True)
class KubernetesOptions:
    """Resolved options of one rendering (:func:`cfg_table` prints the same help).

    >>> KubernetesOptions().rdzv_port
    29500

    Args:
        namespace: namespace of every object.
        run_id: the orchestrator's run id: object names end in a hash of it; ``None``: a
            fresh random id.
        service_account: ``serviceAccountName`` of every pod; ``None``: the namespace's default.
        image_pull_secrets: Secrets to pull images with.
        image_pull_policy: ``Always``, ``IfNotPresent`` or ``Never``; ``None``: Kubernetes' default.
        priority_class: ``priorityClassName`` of every pod.
        queue: the Kueue LocalQueue (label ``kueue.x-k8s.io/queue-name`` on every Job and bare
            Pod; Jobs are created suspended, for Kueue to admit).
        preemption_retries: how many preemptions (pods with ``DisruptionTarget``, Kueue
            evictions) the step survives before it ends PREEMPTED; never the step's retries.
        labels: extra labels on every object and pod.
        annotations: extra annotations on every object and pod.
        ttl_seconds_after_finished: seconds after which finished Jobs (and their pods) are deleted.
        active_deadline: seconds a role may run before Kubernetes stops and fails it (the
            smallest of this and the plan's timeouts wins).
        pod: 1-replica roles: ``True`` a bare Pod, ``False`` an Indexed Job of 1; ``None``:
            a Pod unless the role's retries need the Job controller.
        shm_size: ``sizeLimit`` of the ``/dev/shm`` memory volume (``8Gi``); ``None``: the
            pod's memory limit.
        rdzv_port: the rendezvous port of multi-replica roles (a ``c10d`` port wins).
        join_timeout: seconds a replica waits in the rendezvous for its peers.
        cluster_domain: the cluster's DNS domain (part of replica 0's FQDN).
        store_takeover: elastic multi-replica roles (on by default): the rendezvous store moves
            to a surviving replica when replica 0's agent dies, or when its node goes silent
            and the others are a majority, or half with the run's Lease (``--rdzv-conf
            store_takeover=on,store_witness=kubernetes`` with the other replicas' FQDNs as
            ``store_candidates``: docs/agent.md); ``False``: torchrun's way.
        store_witness: with ``store_takeover``: the run's Lease decides an even split (the
            pods' service account needs get/create/update on leases); ``False``: an even
            split keeps the store in replica 0.
        result_file: absolute path in the container where the agent writes the step result;
            ``None``: none besides the termination message.
    """

    namespace: str = "default"
    run_id: str | None = None
    service_account: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    image_pull_policy: str | None = None
    priority_class: str | None = None
    queue: str | None = None
    preemption_retries: int = DEFAULT_PREEMPTION_RETRIES
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    ttl_seconds_after_finished: int | None = None
    active_deadline: int | None = None
    pod: bool | None = None
    shm_size: str | None = None
    rdzv_port: int = DEFAULT_RDZV_PORT
    join_timeout: int = 900
    cluster_domain: str = "cluster.local"
    store_takeover: bool = True
    store_witness: bool = True
    result_file: str | None = None


def resolve(cfg: Mapping[str, Any] | None, *, namespace: str | None = None) -> KubernetesOptions:
    """Check ``cfg`` against :func:`cfg_table` and fill in defaults. Values may be typed or
    strings (as ``--cfg key=value`` gives them). ``namespace`` (the ``render`` argument) is
    used unless ``cfg`` names another one.

    Args:
        cfg: option name → value; ``None``: all defaults.
        namespace: the namespace to use when ``cfg`` has none; ``None``: ``default``.

    Returns:
        The resolved options.

    Raises:
        SpecError: an unknown key or a bad value, naming ``cfg['<key>']``.
    """
    out = {key: _check(key, value) for key, value in parse_options(cfg, _OPTS, target=TARGET).items()}
    if namespace is not None:
        ns = _check("namespace", namespace)
        if out.get("namespace", ns) != ns:
            raise SpecError(
                "cfg['namespace']", TARGET, f"{out['namespace']!r} conflicts with namespace={ns!r}", fix="give one"
            )
        out["namespace"] = ns
    for key in ("image_pull_secrets",):
        if key in out:
            out[key] = tuple(out[key])
    return KubernetesOptions(**out)


def _check(key: str, value: Any) -> Any:
    """Kubernetes syntax of one option value."""
    path = f"cfg[{key!r}]"
    checks = {
        "namespace": (names.is_dns_label, "a DNS-1123 label", "e.g. 'ml-team'"),
        "service_account": (names.is_dns_subdomain, "a valid ServiceAccount name", "e.g. 'trainer'"),
        "priority_class": (names.is_dns_subdomain, "a valid PriorityClass name", "e.g. 'high-priority'"),
        "queue": (names.is_label_value, "a valid label value", "e.g. 'team-a-queue'"),
        "cluster_domain": (names.is_dns_subdomain, "a DNS domain", "e.g. 'cluster.local'"),
        "shm_size": (names.is_quantity, "a Kubernetes quantity", "e.g. '8Gi'"),
    }
    if key in checks:
        ok, what, fix = checks[key]
        if not ok(value):
            raise SpecError(path, TARGET, f"{value!r} is not {what}", fix=fix)
    elif key == "run_id" and (not value.strip() or not value.isprintable()):
        raise SpecError(path, TARGET, "must be a non-empty printable string", fix="pass the orchestrator's run id")
    elif key == "image_pull_secrets":
        for name in value:
            if not names.is_dns_subdomain(name):
                raise SpecError(path, TARGET, f"{name!r} is not a valid Secret name", fix="e.g. 'regcred'")
    elif key == "image_pull_policy" and value not in PULL_POLICIES:
        raise SpecError(
            path, TARGET, f"{value!r} is not an image pull policy", fix=f"one of {', '.join(PULL_POLICIES)}"
        )
    elif key in ("labels", "annotations"):
        for k, v in value.items():
            if not names.is_qualified_name(k):
                raise SpecError(f"{path}[{k!r}]", TARGET, "not a valid label/annotation key", fix="e.g. 'team'")
            if key == "labels" and not names.is_label_value(v):
                raise SpecError(f"{path}[{k!r}]", TARGET, f"{v!r} is not a valid label value", fix="e.g. 'ml'")
    elif key == "preemption_retries" and value < 0:
        raise SpecError(path, TARGET, "must not be negative", fix="e.g. 10 (0: the first preemption ends the step)")
    elif key in ("ttl_seconds_after_finished",) and value < 0:
        raise SpecError(path, TARGET, "must not be negative", fix="e.g. 3600")
    elif key in ("active_deadline", "join_timeout") and value <= 0:
        raise SpecError(path, TARGET, "must be a positive number of seconds", fix="e.g. 3600")
    elif key == "rdzv_port" and not 1 <= value <= 65535:
        raise SpecError(path, TARGET, "must be a port in 1..65535", fix="e.g. 29500")
    elif key == "result_file" and not value.startswith("/"):
        raise SpecError(path, TARGET, "must be an absolute path in the container", fix="e.g. /tmp/result.json")
    return value
