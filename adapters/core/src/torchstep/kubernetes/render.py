"""StepPlan → Kubernetes objects (plain dicts): per role a bare Pod (1 replica) or an
Indexed Job (several replicas) plus a headless Service and a NetworkPolicy, all labelled so
that one selector lists or deletes the whole run.

The NetworkPolicy of a multi-replica role admits traffic to its pods from the same run's pods
only (the rendezvous store, the workers' store and the collectives' own connections, whose
ports are picked at run time), plus the role's declared ports from anywhere as before: torch's
stores have no authentication (issue 33).

Example::

    >>> import torchstep
    >>> from torchstep.kubernetes import render_plan
    >>> plan = torchstep.build_plan(torchstep.materialize("dist.ddp", ["-j", "2x1", "--script", "t.py"]), "kubernetes")
    >>> app = render_plan(plan, namespace="ml", run_id="run-1")
    >>> r = app.roles[0]
    >>> (r.kind, r.name, r.rank0_host)
    ('Job', 't-t-4e65d3fb', 't-t-4e65d3fb-0.t-t-4e65d3fb.ml.svc.cluster.local')
    >>> app.label_selector
    'torchstep/app-id=t-4e65d3fb'
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchstep.errors import SpecError
from torchstep.kubernetes.failure import job_failure_fields, needs_job
from torchstep.kubernetes.options import QUEUE_LABEL, KubernetesOptions, resolve
from torchstep.kubernetes.overlay import apply_overlay
from torchstep.kubernetes.pod import CONTAINER_NAME, Endpoint, pod_spec
from torchstep.kubernetes.readiness import add_readiness
from torchstep.plan.model import RetryOwner, RolePlan, StepPlan
from torchstep.plan.names import JOB_NAME_MAX, dns_label, run_name, short_id
from torchstep.plan.planner import build_plan
from torchstep.plan.secrets import INLINED_INTO, warn_inlined

TARGET = "kubernetes"
#: The oldest Kubernetes release the rendered objects are meant for (``backoffLimitPerIndex``,
#: ``podFailurePolicy`` with ``FailIndex``/``Count``, ``successPolicy`` and
#: ``podReplacementPolicy`` are GA there or earlier).
MIN_KUBERNETES_VERSION = "1.33"

#: Label on every object and pod of one run: its value is the run's app id.
LABEL_APP_ID = "torchstep/app-id"
#: Label on every object and pod of one role (with :data:`LABEL_APP_ID`): the role's DNS name.
LABEL_ROLE = "torchstep/role"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
#: Annotations keeping the AppDef's own (unsanitised) names.
ANNOTATION_APP_NAME = "torchstep/app-name"
ANNOTATION_ROLE_NAME = "torchstep/role-name"
_OWNED_LABELS = frozenset({LABEL_APP_ID, LABEL_ROLE, LABEL_MANAGED_BY, LABEL_NAME, QUEUE_LABEL})
_OWNED_ANNOTATIONS = frozenset({ANNOTATION_APP_NAME, ANNOTATION_ROLE_NAME})
#: Kueue's partial admission: the fewest pods of a Job Kueue may admit it with (it lowers
#: ``parallelism``). Read from the Job, so an overlay's (pod template) copy goes there too.
MIN_PARALLELISM_ANNOTATION = "kueue.x-k8s.io/job-min-parallelism"
_SUFFIX_LEN = 8  # names.run_name's run-unique suffix


@dataclass(frozen=True)
class RenderedRole:
    """One role's objects and the names that tie them together.

    ``kind`` is ``Pod`` or ``Job``; ``workload`` that object; ``service`` the headless
    Service (several replicas, or declared ports) or ``None``; ``network_policy`` the
    NetworkPolicy of a multi-replica role (else ``None``); ``template`` the pod
    template (``metadata`` + ``spec``) every replica runs; ``labels`` are on every object
    of the role and ``selector`` selects its pods; ``rank0_host`` is what
    ``TORCHX_RANK0_HOST`` holds (replica 0's FQDN, or ``localhost`` for one replica).
    ``notes`` explain choices that are not obvious from the objects.

    Args:
        role: the role's plan.
        index: the role's position in the AppDef.
        name: the name of its workload and Service (:func:`object_name`).
        kind: ``Pod`` or ``Job``.
        labels: labels on every object of the role.
        selector: labels that select the role's pods.
        template: the pod template every replica runs.
        workload: the Pod or Job object.
        service: the headless Service, or ``None``.
        rank0_host: what ``TORCHX_RANK0_HOST`` holds.
        rdzv_endpoint: ``host:port`` of the c10d rendezvous.
        notes: choices that are not obvious from the objects.
        single_pod: the standalone Pod of a 1-replica role (:attr:`pod`); ``None`` otherwise.
        network_policy: the NetworkPolicy of a multi-replica role; ``None`` otherwise.
    """

    role: RolePlan
    index: int
    name: str
    kind: str
    labels: Mapping[str, str]
    selector: Mapping[str, str]
    template: Mapping[str, Any]
    workload: Mapping[str, Any]
    service: Mapping[str, Any] | None
    rank0_host: str
    rdzv_endpoint: str
    notes: tuple[str, ...] = ()
    single_pod: Mapping[str, Any] | None = field(default=None, repr=False)
    network_policy: Mapping[str, Any] | None = None

    @property
    def objects(self) -> list[dict[str, Any]]:
        """The role's objects, Service first (its DNS records must exist before pods start),
        then the NetworkPolicy (in force before any store listens), then the workload."""
        return [copy.deepcopy(dict(o)) for o in (self.service, self.network_policy, self.workload) if o is not None]

    @property
    def pod(self) -> dict[str, Any]:
        """The standalone Pod of a 1-replica role — what KubernetesPodOperator runs (its
        container is :data:`~torchstep.kubernetes.CONTAINER_NAME`). Available whether the
        role renders as a Pod or a Job; the Service (declared ports) is in :attr:`objects`.
        """
        if self.single_pod is None:
            raise SpecError(
                f"roles[{self.index}].num_replicas",
                TARGET,
                f"role {self.role.name!r} has {self.role.num_replicas} replicas: it is an Indexed Job, not one Pod",
                fix="submit RenderedRole.objects (the Job and its headless Service)",
            )
        return copy.deepcopy(dict(self.single_pod))


@dataclass(frozen=True)
class RenderedApp:
    """Every object of one run of an AppDef, per role.

    ``app_id`` is the run-unique name bound to ``${app_id}``; ``selector`` / ``label_selector``
    select every object and pod of the run (``kubectl delete jobs,pods,services -l ...``).

    Args:
        plan: the kubernetes plan rendered.
        app_id: the run-unique name bound to ``${app_id}``.
        namespace: the namespace of every object.
        options: the resolved run options.
        roles: one rendering per role, in the plan's order.
    """

    plan: StepPlan
    app_id: str
    namespace: str
    options: KubernetesOptions
    roles: tuple[RenderedRole, ...]

    @property
    def selector(self) -> dict[str, str]:
        """Labels that select every object and pod of the run."""
        return {LABEL_APP_ID: self.app_id}

    @property
    def label_selector(self) -> str:
        """:attr:`selector` as a ``-l`` / ``label_selector`` string."""
        return f"{LABEL_APP_ID}={self.app_id}"

    @property
    def objects(self) -> list[dict[str, Any]]:
        """Every object: all Services and NetworkPolicies first, then the Pods and Jobs."""
        first = ("Service", "NetworkPolicy")
        services = [o for r in self.roles for o in r.objects if o["kind"] in first]
        return services + [o for r in self.roles for o in r.objects if o["kind"] not in first]

    def role(self, name: str) -> RenderedRole:
        """The rendered role called ``name``.

        Args:
            name: the role's AppDef name.

        Returns:
            The rendered role.

        Raises:
            SpecError: no role has that name (the fix lists those there are).
        """
        for r in self.roles:
            if r.role.name == name:
                return r
        raise SpecError(
            "role", TARGET, f"no role {name!r}", fix=f"one of: {', '.join(r.role.name for r in self.roles)}"
        )


def render(app: Any, *, namespace: str = "default", cfg: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Kubernetes objects (plain dicts) for ``app`` — a ``torchx.specs.AppDef`` or a
    kubernetes :class:`~torchstep.StepPlan` — ready for ``kubectl apply``. ``cfg`` are the
    :func:`~torchstep.kubernetes.cfg_table` (a ``namespace`` there wins over the default).

    Args:
        app: a ``torchx.specs.AppDef`` (planned for ``kubernetes`` here) or a kubernetes plan.
        namespace: the namespace of every object, unless ``cfg`` names one.
        cfg: run options (:func:`~torchstep.kubernetes.cfg_table`); ``None``: the defaults.

    Returns:
        Every object as a dict: the Services and NetworkPolicies first, then the Pods and Jobs.

    Raises:
        SpecError: the AppDef cannot run on Kubernetes, or an option is bad.

    >>> import torchstep
    >>> objs = render(torchstep.materialize("utils.echo", ["--msg", "hi"]), namespace="ml", cfg={"run_id": "r1"})
    >>> [(o["kind"], o["metadata"]["name"]) for o in objs]
    [('Pod', 'echo-echo-82f3e9c6')]
    """
    return render_app(app, namespace=namespace, cfg=cfg).objects


def render_app(app: Any, *, namespace: str = "default", cfg: Mapping[str, Any] | None = None) -> RenderedApp:
    """:func:`render`, returning the :class:`RenderedApp` (names, selectors, per role).

    Args:
        app: a ``torchx.specs.AppDef`` or a kubernetes plan.
        namespace: the namespace of every object, unless ``cfg`` names one.
        cfg: run options; ``None``: the defaults.

    Returns:
        The rendering of one run.

    Raises:
        SpecError: the AppDef cannot run on Kubernetes, or an option is bad.
    """
    plan = app if isinstance(app, StepPlan) else build_plan(app, TARGET)
    return render_plan(plan, namespace=None if namespace == "default" else namespace, cfg=cfg)


def render_pod(
    app: Any, *, role: str | None = None, namespace: str = "default", cfg: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The standalone Pod (a dict) of a 1-replica role of ``app`` — what
    KubernetesPodOperator runs. ``role`` names the role when the app has several.

    Args:
        app: a ``torchx.specs.AppDef`` or a kubernetes plan.
        role: the role's name; ``None``: the only role.
        namespace: the Pod's namespace, unless ``cfg`` names one.
        cfg: run options; ``None``: the defaults.

    Returns:
        The Pod as a dict.

    Raises:
        SpecError: the app has several roles and ``role`` is not given or unknown, the
            role has several replicas, or the AppDef cannot run on Kubernetes.

    >>> import torchstep
    >>> pod = render_pod(torchstep.materialize("utils.echo", ["--msg", "hi"]), cfg={"run_id": "r1"})
    >>> pod["spec"]["containers"][0]["command"], pod["spec"]["restartPolicy"]
    (['torchstep-agent'], 'Never')
    """
    rendered = render_app(app, namespace=namespace, cfg=cfg)
    if role is None:
        if len(rendered.roles) != 1:
            names = ", ".join(r.role.name for r in rendered.roles)
            raise SpecError(
                "role", TARGET, f"the app has {len(rendered.roles)} roles", fix=f"pass role= one of {names}"
            )
        return rendered.roles[0].pod
    return rendered.role(role).pod


def owned_by(obj: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` that Kubernetes garbage-collects with ``owner`` — an object as the
    API server returned it (its ``metadata.uid`` exists only then). Adapters use it to tie a
    role's Service to its Job after creating the Job, so ``ttlSecondsAfterFinished`` or
    deleting the Job removes the Service too.

    Args:
        obj: the object to tie (not changed).
        owner: the owner as the API server returned it (with ``metadata.uid``).

    Returns:
        A copy of ``obj`` with an ``ownerReferences`` entry for ``owner``.

    Raises:
        ValueError: ``owner`` has no ``metadata.uid`` (it was not read back from the API server).

    >>> job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "uid": "123"}}
    >>> owned_by({"kind": "Service", "metadata": {"name": "j"}}, job)["metadata"]["ownerReferences"]
    [{'apiVersion': 'batch/v1', 'kind': 'Job', 'name': 'j', 'uid': '123'}]
    """
    meta = owner.get("metadata", {})
    if not meta.get("uid"):
        raise ValueError("the owner has no metadata.uid: pass the object the API server returned")
    ref = {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}
    out = copy.deepcopy(dict(obj))
    out.setdefault("metadata", {}).setdefault("ownerReferences", []).append(ref)
    return out


def render_plan(
    plan: StepPlan,
    *,
    namespace: str | None = None,
    run_id: str | None = None,
    cfg: Mapping[str, Any] | None = None,
) -> RenderedApp:
    """Render a kubernetes ``plan`` for one run. ``run_id`` (or ``cfg["run_id"]``) is the
    orchestrator's run id: names end in a hash of it, so the same id renders the same names
    (default: a fresh random id). ``namespace`` (or ``cfg["namespace"]``) defaults to
    ``default``.

    Args:
        plan: a plan built for the ``kubernetes`` target.
        namespace: the namespace of every object; ``None``: ``cfg["namespace"]`` or ``default``.
        run_id: the orchestrator's run id; ``None``: ``cfg["run_id"]`` or a fresh random id.
        cfg: run options; ``None``: the defaults.

    Returns:
        The rendering of one run.

    Raises:
        SpecError: the plan is for another target, or an option is bad.
    """
    if plan.target != TARGET:
        raise SpecError("target", None, f"the plan was built for {plan.target!r}", fix="build_plan(app, 'kubernetes')")
    cfg = dict(cfg or {})
    if run_id is not None:
        if cfg.get("run_id") not in (None, run_id):
            raise SpecError("cfg['run_id']", TARGET, f"conflicts with run_id={run_id!r}", fix="give one")
        cfg["run_id"] = run_id
    opts = resolve(cfg, namespace=namespace)
    _check_owned(opts)
    rid = opts.run_id or short_id(12)
    app_id = run_name(plan.k8s_name, rid)
    roles = tuple(_render_role(plan, i, role, app_id, rid, opts) for i, role in enumerate(plan.roles))
    warn_inlined(
        plan, INLINED_INTO[TARGET]
    )  # a plain HF_TOKEN in env ends up in the objects, readable by all who read them
    return RenderedApp(plan=plan, app_id=app_id, namespace=opts.namespace, options=opts, roles=roles)


def _check_owned(opts: KubernetesOptions) -> None:
    for key in opts.labels:
        if key in _OWNED_LABELS:
            fix = "use the queue option" if key == QUEUE_LABEL else "use another label key"
            raise SpecError(f"cfg['labels'][{key!r}]", TARGET, "torchstep sets this label itself", fix=fix)
    for key in opts.annotations:
        if key in _OWNED_ANNOTATIONS:
            raise SpecError(
                f"cfg['annotations'][{key!r}]", TARGET, "torchstep sets this annotation", fix="use another key"
            )


def object_name(plan: StepPlan, role: RolePlan, run_id: str) -> str:
    """``<app>-<role>-<hash of run_id>``: a DNS-1035 label (a Service name) short enough for
    Job pod hostnames ``<name>-<index>``; deterministic for one run id.

    Args:
        plan: the kubernetes plan.
        role: one of its roles.
        run_id: the orchestrator's run id.

    Returns:
        The name.

    >>> import torchstep
    >>> plan = torchstep.build_plan(torchstep.materialize("utils.echo", []), "kubernetes")
    >>> object_name(plan, plan.roles[0], "r1")
    'echo-echo-82f3e9c6'
    """
    base = f"{plan.k8s_name}-{role.k8s_name}"
    if not base[0].isalpha():  # Service names must start with a letter
        base = f"ts-{base}"
    return run_name(dns_label(base, max_len=JOB_NAME_MAX - _SUFFIX_LEN - 1), run_id)


def _render_role(
    plan: StepPlan, i: int, role: RolePlan, app_id: str, run_id: str, opts: KubernetesOptions
) -> RenderedRole:
    path = f"roles[{i}]"
    name = object_name(plan, role, run_id)
    kind, notes = _kind(role, path, opts)
    indexed = role.num_replicas > 1
    rdzv_port = _rdzv_port(role, path, opts) if indexed else opts.rdzv_port
    rank0 = f"{name}-0.{name}.{opts.namespace}.svc.{opts.cluster_domain}" if indexed else "localhost"
    ep = Endpoint(app_id=app_id, rdzv_id=name, rank0_host=rank0, rdzv_port=rdzv_port, indexed=indexed)

    selector = {LABEL_APP_ID: app_id, LABEL_ROLE: role.k8s_name}
    labels = {LABEL_MANAGED_BY: "torchstep", LABEL_NAME: plan.k8s_name, **opts.labels, **selector}
    annotations = {ANNOTATION_APP_NAME: plan.app_name, ANNOTATION_ROLE_NAME: role.name, **opts.annotations}
    spec = pod_spec(role, ep, opts, role_path=path, subdomain=name if indexed else None)
    tmeta: dict[str, Any] = {"labels": dict(labels), "annotations": dict(annotations)}
    overlay = role.metadata.get("kubernetes")
    if overlay is not None:
        apply_overlay(tmeta, spec, overlay, path)
    if indexed:
        add_readiness(spec)  # Ready = the gang formed (Kueue's waitForPodsReady); an overlay's probe wins
    template = {"metadata": tmeta, "spec": spec}

    meta: dict[str, Any] = {"name": name, "namespace": opts.namespace, "labels": labels, "annotations": annotations}
    queue = {QUEUE_LABEL: opts.queue} if opts.queue else {}
    deadline = _deadline(plan, role, opts)
    single_pod: dict[str, Any] | None = None
    if role.num_replicas == 1:
        # the template's metadata (overlay included) plus the Kueue queue label
        pod_meta = {"name": name, "namespace": opts.namespace, **copy.deepcopy(tmeta)}
        pod_meta["labels"].update(queue)
        single_pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": pod_meta,
            "spec": {**copy.deepcopy(spec), **({"activeDeadlineSeconds": deadline} if deadline else {})},
        }
    if kind == "Pod":
        assert single_pod is not None
        workload: dict[str, Any] = copy.deepcopy(single_pod)
    else:
        job_spec: dict[str, Any] = {
            "completionMode": "Indexed",
            "completions": role.num_replicas,
            "parallelism": role.num_replicas,
            **job_failure_fields(role, CONTAINER_NAME),
        }
        if role.elastic:
            # the run is done when replica 0 is: a replica that never got scheduled must not hold it
            job_spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
        if deadline:
            job_spec["activeDeadlineSeconds"] = deadline
        if opts.ttl_seconds_after_finished is not None:
            job_spec["ttlSecondsAfterFinished"] = opts.ttl_seconds_after_finished
        job_spec["template"] = copy.deepcopy(template)
        if opts.queue:
            # created suspended: no pod starts before Kueue admits the Job (what Kueue's webhook
            # would do; without the webhook, nothing would run around the queue's quota)
            job_spec["suspend"] = True
        job_annotations = dict(annotations)
        from_overlay = tmeta["annotations"].get(MIN_PARALLELISM_ANNOTATION)
        if from_overlay is not None:
            job_annotations[MIN_PARALLELISM_ANNOTATION] = from_overlay
        _check_min_parallelism(role, path, job_annotations.get(MIN_PARALLELISM_ANNOTATION))
        job_meta = {**meta, "labels": {**labels, **queue}, "annotations": job_annotations}
        workload = {"apiVersion": "batch/v1", "kind": "Job", "metadata": job_meta, "spec": job_spec}
    service = _service(meta, selector, spec) if indexed or role.ports else None
    policy = _network_policy(meta, selector, {LABEL_APP_ID: app_id}, spec, rdzv_port) if indexed else None
    return RenderedRole(
        role=role,
        index=i,
        name=name,
        kind=kind,
        labels=labels,
        selector=selector,
        template=template,
        workload=workload,
        service=service,
        rank0_host=rank0,
        rdzv_endpoint=ep.rdzv_endpoint,
        notes=tuple(notes),
        single_pod=single_pod,
        network_policy=policy,
    )


def _kind(role: RolePlan, path: str, opts: KubernetesOptions) -> tuple[str, list[str]]:
    """Pod or Job, and why (see the ``pod`` run option)."""
    if role.num_replicas > 1:
        return "Job", []
    if opts.pod is None:
        if needs_job(role):
            return "Job", [
                f"{path}: 1 replica rendered as an Indexed Job of 1 because its {role.retry.policy} retries need the "
                "Job controller (set the run option pod=true for a bare Pod)"
            ]
        return "Pod", []
    if not opts.pod:
        return "Job", []
    if role.retry.owner is RetryOwner.ROLE:
        raise SpecError(
            "cfg['pod']",
            TARGET,
            f"role {role.name!r} has ROLE retries (max_retries={role.retry.count}), which a bare Pod cannot carry",
            fix="leave pod unset (a Job is rendered), or use APPLICATION retries",
        )
    if role.retry.owner is RetryOwner.AGENT:
        return "Pod", [
            f"{path}: bare Pod (pod=true): the agent restarts failed workers, but a lost pod is not replaced"
        ]
    return "Pod", []


def _check_min_parallelism(role: RolePlan, path: str, value: str | None) -> None:
    """Kueue's partial admission may start a Job with fewer pods, down to the annotation's
    value: fewer than the role's ``min_replicas`` would never form its rendezvous."""
    if value is None:
        return
    field = f"{path}: annotation {MIN_PARALLELISM_ANNOTATION}"
    if not str(value).isdigit() or not 1 <= int(value) <= role.num_replicas:
        raise SpecError(
            field,
            TARGET,
            f"{value!r} is not a whole number of pods in 1..{role.num_replicas}",
            fix=f"e.g. '{role.min_replicas}' (the role's min_replicas)",
        )
    if int(value) < role.min_replicas:
        raise SpecError(
            field,
            TARGET,
            f"Kueue could admit {value} pod(s) of role {role.name!r}, which needs {role.min_replicas} to form its "
            "rendezvous: the admitted pods would wait for the others until join_timeout",
            fix=f"set it to at least {role.min_replicas}, or make the role elastic (min_replicas)",
        )


def _rdzv_port(role: RolePlan, path: str, opts: KubernetesOptions) -> int:
    """A multi-replica role's rendezvous port: its rendezvous-named port_map entry, else the
    run option — which no other declared port may take."""
    for p in role.ports:
        if p.rendezvous:
            return p.port
    for p in role.ports:
        if p.port == opts.rdzv_port:
            raise SpecError(
                f"{path}.port_map[{p.name!r}]",
                TARGET,
                f"port {p.port} is the rendezvous port of this multi-replica role",
                fix="use another port, or name it c10d if it is the rendezvous port, or set the run option rdzv_port",
            )
    return opts.rdzv_port


def _deadline(plan: StepPlan, role: RolePlan, opts: KubernetesOptions) -> int | None:
    limits = [t for t in (plan.timeout_s, role.timeout_s, opts.active_deadline) if t is not None]
    return math.ceil(min(limits)) if limits else None


def _service(meta: Mapping[str, Any], selector: Mapping[str, str], spec: Mapping[str, Any]) -> dict[str, Any]:
    """A headless Service: per-replica DNS (``<job>-<index>.<service>``) for a Job's pods,
    published before they are ready (the rendezvous starts before any readiness)."""
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["containerPort"], "protocol": "TCP"}
        for p in spec["containers"][0].get("ports", [])
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": copy.deepcopy(dict(meta)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": dict(selector),
            "ports": ports,
        },
    }


def _network_policy(
    meta: Mapping[str, Any],
    selector: Mapping[str, str],
    run_selector: Mapping[str, str],
    spec: Mapping[str, Any],
    rdzv_port: int,
) -> dict[str, Any]:
    """The role's pods accept connections from the run's own pods on every port (the
    rendezvous store, the workers' store, gloo/NCCL: their ports are picked at run time), and
    from anywhere on the role's other declared ports only (a pod selected by an ingress
    policy refuses every port no rule allows)."""
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": dict(run_selector)}}]}]
    declared = sorted(
        {p["containerPort"] for p in spec["containers"][0].get("ports", []) if p["containerPort"] != rdzv_port}
    )
    if declared:
        ingress.append({"ports": [{"port": port, "protocol": "TCP"} for port in declared]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": copy.deepcopy(dict(meta)),
        "spec": {"podSelector": {"matchLabels": dict(selector)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }
