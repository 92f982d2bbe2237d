"""Kueue's visible contract, played on the one-machine cluster (test infrastructure; Kueue's
own controllers cannot run here). What a Job in a LocalQueue sees of Kueue, and nothing else:

- **suspended until admitted**: a Job labelled ``kueue.x-k8s.io/queue-name`` stays
  ``spec.suspend: true`` (torchstep creates it so; Kueue's webhook would force it) and its
  Job controller creates no pod;
- **admission**: Kueue writes the admitted flavor's ``nodeSelector`` and ``tolerations`` into
  the pod template (``podSetInfo``) and sets ``spec.suspend: false``; the Job controller then
  creates the pods (and ``activeDeadlineSeconds`` counts from then);
- **eviction** (preemption by a higher-priority workload, ``waitForPodsReady`` timeout, a
  ClusterQueue change): Kueue sets ``spec.suspend: true`` again and restores the original pod
  template; the Job controller deletes the running pods without counting them as failures;
  the Workload (not modelled: no Workload objects here) is requeued and admitted again later.

What is not played: quotas, flavors, cohorts, priorities, the Workload object and its
conditions (``Admitted``, ``Evicted``, ``PodsReady``), partial admission's parallelism change.
The tests drive admission and eviction explicitly, so each transition happens when the test
says (deterministic under load).
"""

from __future__ import annotations

import copy
from typing import Any

from cluster.harness import Cluster

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


class Kueue:
    """Admits and evicts the cluster's queued Jobs as Kueue would (see the module docstring).

    Args:
        cluster: the one-machine cluster whose Jobs it manages.
    """

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._templates: dict[str, dict[str, Any]] = {}  # Job name -> its pod template before admission
        self.admissions: list[str] = []
        self.evictions: list[str] = []

    def queued(self, queue: str) -> list[dict[str, Any]]:
        """The Jobs of ``queue`` waiting for admission (suspended)."""
        return [j for j in self.cluster.items("jobs", f"{QUEUE_LABEL}={queue}") if j["spec"].get("suspend")]

    def admit(self, name: str, node_selector: dict[str, str] | None = None,
              tolerations: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
        """Admit Job ``name``: inject the flavor's node selector and tolerations into its pod
        template, then unsuspend it (one update, as Kueue's job reconciler does)."""
        job = self.cluster.get("jobs", name)
        assert job["spec"].get("suspend"), f"Job {name} is not suspended: Kueue admits only suspended Jobs"
        assert job["metadata"]["labels"].get(QUEUE_LABEL), f"Job {name} has no {QUEUE_LABEL} label"
        template = job["spec"]["template"]
        self._templates.setdefault(name, copy.deepcopy(template))
        admitted = copy.deepcopy(template)
        spec = admitted["spec"]
        if node_selector:
            spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **node_selector}
        if tolerations:
            spec["tolerations"] = [*(spec.get("tolerations") or []), *tolerations]
        out = self.cluster.api(
            "PATCH", self.cluster.path("jobs", name), {"spec": {"template": admitted, "suspend": False}}
        )
        assert out.get("kind") == "Job", out
        self.admissions.append(name)
        return out

    def evict(self, name: str) -> dict[str, Any]:
        """Evict admitted Job ``name``: suspend it again and restore its original pod template
        (the Job controller deletes its pods, uncounted)."""
        job = self.cluster.get("jobs", name)
        assert not job["spec"].get("suspend"), f"Job {name} is not admitted: nothing to evict"
        body: dict[str, Any] = {"suspend": True}
        if name in self._templates:
            body["template"] = self._templates[name]
        out = self.cluster.api("PATCH", self.cluster.path("jobs", name), {"spec": body})
        assert out.get("kind") == "Job", out
        self.evictions.append(name)
        return out
