"""The kubernetes target: a TorchX AppDef as plain Kubernetes objects (dicts).

Per role: a bare Pod (1 replica; what KubernetesPodOperator runs) or an Indexed Job
(several replicas, or retries that need the Job controller) plus a headless Service that
gives replica 0 a stable DNS name for the rendezvous and a NetworkPolicy that lets only the
run's own pods reach its stores. :class:`JobGang` runs the rendered
objects of one attempt on a cluster (create, follow logs, collect the result, delete) through
an injected client. Every container runs the embedded
agent (``torchstep-agent``), so the image must contain ``torchstep[agent]``. The mapping is
documented in ``docs/kubernetes.md``.

Importing this package is cheap: no torch, no kubernetes client, no yaml.

Example::

    >>> import torchstep
    >>> app = torchstep.materialize("dist.ddp", ["-j", "2x1", "--script", "train.py"])
    >>> [o["kind"] for o in torchstep.kubernetes.render(app, namespace="ml")]
    ['Service', 'NetworkPolicy', 'Job']
    >>> rendered = torchstep.kubernetes.render_app(app, namespace="ml", cfg={"run_id": "run-7"})
    >>> rendered.roles[0].workload["spec"]["completionMode"], rendered.label_selector
    ('Indexed', 'torchstep/app-id=train-b4c05df0')
"""

from __future__ import annotations

from torchstep.kubernetes.client import KubernetesClient, OfficialClient
from torchstep.kubernetes.failure import (
    REPLACED_EXIT_CODES,
    SIGKILLED_EXIT_CODE,
    SIGTERMED_EXIT_CODE,
    FailureKind,
    classify_exit,
    job_failure_fields,
)
from torchstep.kubernetes.jobs import ON_FINISH, JobGang
from torchstep.kubernetes.options import QUEUE_LABEL, KubernetesOptions, cfg_table, resolve
from torchstep.kubernetes.pod import CONTAINER_NAME, LAUNCH_COMMAND
from torchstep.kubernetes.render import (
    ANNOTATION_APP_NAME,
    ANNOTATION_ROLE_NAME,
    LABEL_APP_ID,
    LABEL_ROLE,
    MIN_KUBERNETES_VERSION,
    RenderedApp,
    RenderedRole,
    object_name,
    owned_by,
    render,
    render_app,
    render_plan,
    render_pod,
)

__all__ = [
    "ANNOTATION_APP_NAME",
    "ANNOTATION_ROLE_NAME",
    "CONTAINER_NAME",
    "LABEL_APP_ID",
    "LABEL_ROLE",
    "LAUNCH_COMMAND",
    "MIN_KUBERNETES_VERSION",
    "ON_FINISH",
    "QUEUE_LABEL",
    "REPLACED_EXIT_CODES",
    "SIGKILLED_EXIT_CODE",
    "SIGTERMED_EXIT_CODE",
    "FailureKind",
    "JobGang",
    "KubernetesClient",
    "KubernetesOptions",
    "OfficialClient",
    "RenderedApp",
    "RenderedRole",
    "cfg_table",
    "classify_exit",
    "job_failure_fields",
    "object_name",
    "owned_by",
    "render",
    "render_app",
    "render_plan",
    "render_pod",
    "resolve",
]
