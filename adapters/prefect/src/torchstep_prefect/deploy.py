"""Deploying flows of torchstep tasks to a Prefect Kubernetes work pool.

:func:`job_variables` derives a flow run's job variables from an AppDef — the image, cpu,
memory, GPU, node selector, tolerations, volumes (PVCs, host paths, ``/dev/shm``), env and
Secret references — with torchstep's own Kubernetes rules (``torchstep.kubernetes``), so
the flow-run pod that hosts a ``target="local"`` step has what the step needs.
:func:`base_job_template` is prefect-kubernetes' default template plus the variables it
lacks (resources, GPU, node selector, tolerations, volumes, Secret env), with
``completions``/``parallelism`` moved to the Job spec where Kubernetes reads them, and
``backoffLimit: 0`` (Prefect's flow retries own re-runs; the Job never re-runs a crashed flow).

Example::

    prefect work-pool create gpu-pool --type kubernetes --base-job-template template.json
    # template.json = json.dumps(torchstep_prefect.base_job_template())

    nightly.deploy(name="nightly", work_pool_name="gpu-pool", image="ghcr.io/acme/train:1",
                   cron="0 2 * * *", job_variables=torchstep_prefect.job_variables(app))
"""

from __future__ import annotations

import copy
from typing import Any

from torchstep import SpecError

#: What a flow-run pod that only launches Jobs (``target="kubernetes"``) asks for.
LAUNCHER_RESOURCES = {"cpu_request": "100m", "memory_request": "512Mi", "memory_limit": "512Mi"}

_NEW_VARIABLES: dict[str, dict[str, Any]] = {
    "cpu_request": {"title": "CPU request", "type": "string", "description": "e.g. '4' or '500m'"},
    "cpu_limit": {"title": "CPU limit", "type": "string"},
    "memory_request": {"title": "Memory request", "type": "string", "description": "e.g. '16Gi'"},
    "memory_limit": {"title": "Memory limit", "type": "string"},
    "gpu_limit": {"title": "GPUs", "type": "integer", "description": "nvidia.com/gpu (request = limit)"},
    "node_selector": {"title": "Node selector", "type": "object"},
    "tolerations": {"title": "Tolerations", "type": "array", "items": {"type": "object"}},
    "volumes": {"title": "Volumes", "type": "array", "items": {"type": "object"}},
    "volume_mounts": {"title": "Volume mounts", "type": "array", "items": {"type": "object"}},
    "secret_env": {
        "title": "Env from Secrets",
        "type": "array",
        "items": {"type": "object"},
        "description": "container env entries with valueFrom.secretKeyRef",
        "default": [],
    },
}


def job_variables(app: Any, *, target: str = "local") -> dict[str, Any]:
    """Job variables for the flow-run pod of a flow running ``app`` (an AppDef or a
    component reference materialised with its defaults) with ``app_task(..., target=target)``.

    ``target="local"``: the step runs inside the flow-run pod, so the pod asks for every
    replica's cpu, memory and GPUs (summed), and carries the roles' volumes, node
    selectors, tolerations, env and Secret references. ``target="kubernetes"``: the pod
    only submits Jobs (which carry their own settings): the image and small resources.

    Args:
        app: an AppDef, or a component reference (materialised with its defaults).
        target: the ``target`` of the flow's ``app_task``: ``"local"`` or ``"kubernetes"``.

    Returns:
        The job variables (``image``, ``cpu_request``, ``memory_limit``, ``gpu_limit``, ``volumes``, ...).

    Raises:
        SpecError: an unknown target, roles with several images (``"local"``), or an AppDef
            the ``kubernetes`` target cannot express.

    >>> from torchx import specs
    >>> role = specs.Role("t", image="img:1", entrypoint="python", num_replicas=2,
    ...                   resource=specs.Resource(cpu=4, gpu=1, memMB=8192))
    >>> v = job_variables(specs.AppDef("a", roles=[role]))
    >>> v["cpu_request"], v["memory_limit"], v["gpu_limit"]
    ('8', '16384Mi', 2)
    """
    import torchstep
    from torchstep.adapter.kubernetes import host_pod

    app_def = torchstep.materialize(app)
    plan = torchstep.build_plan(app_def, "kubernetes")
    out: dict[str, Any] = {"image": plan.roles[0].image}
    if target == "kubernetes":
        return {**out, **LAUNCHER_RESOURCES}
    if target != "local":
        raise SpecError("target", None, f"unknown target {target!r}", fix="use 'local' or 'kubernetes'")
    pod = host_pod(plan)  # every replica in the one flow-run pod
    if len(pod.images) > 1:
        raise SpecError(
            "roles",
            "prefect",
            f"the roles use {len(pod.images)} images, but a flow-run pod has one",
            fix="use one image, or app_task(..., target='kubernetes') (a pod per replica)",
        )
    if pod.cpu:
        out["cpu_request"] = out["cpu_limit"] = f"{pod.cpu:g}"
    if pod.mem_mb:
        out["memory_request"] = out["memory_limit"] = f"{pod.mem_mb}Mi"
    if pod.gpu:
        out["gpu_limit"] = pod.gpu
    out.update({"volumes": pod.volumes, "volume_mounts": pod.volume_mounts})
    for key in ("node_selector", "tolerations", "env", "secret_env"):
        if getattr(pod, key):
            out[key] = getattr(pod, key)
    return out


def base_job_template() -> dict[str, Any]:
    """prefect-kubernetes' default base job template with torchstep's variables (see the
    module docstring); pass it to ``prefect work-pool create --base-job-template``."""
    try:
        from prefect_kubernetes.worker import KubernetesWorker
    except ImportError:
        raise ImportError(
            'base_job_template needs prefect-kubernetes: pip install "torchstep-prefect[kubernetes]"'
        ) from None

    template = copy.deepcopy(KubernetesWorker.get_default_base_job_template())
    props = template["variables"]["properties"]
    for name, schema in _NEW_VARIABLES.items():
        props.setdefault(name, schema)
    job = template["job_configuration"]["job_manifest"]
    pod = job["spec"]["template"]["spec"]
    for key in ("completions", "parallelism"):  # Job fields, misplaced in the pod spec upstream
        if key in pod:
            job["spec"][key] = pod.pop(key)
    job["spec"]["backoffLimit"] = 0
    container = pod["containers"][0]
    container["resources"] = {
        "requests": {"cpu": "{{ cpu_request }}", "memory": "{{ memory_request }}", "nvidia.com/gpu": "{{ gpu_limit }}"},
        "limits": {"cpu": "{{ cpu_limit }}", "memory": "{{ memory_limit }}", "nvidia.com/gpu": "{{ gpu_limit }}"},
    }
    container["volumeMounts"] = "{{ volume_mounts }}"
    container["env"] = "{{ secret_env }}"  # Prefect prepends the flow run's env to this list
    pod["volumes"] = "{{ volumes }}"
    pod["nodeSelector"] = "{{ node_selector }}"
    pod["tolerations"] = "{{ tolerations }}"
    return template
