"""docs/security.md's RBAC example is what a cluster admin copies: every object validates
strictly against the official schemas, and the runner Role grants every call torchstep's
Kubernetes client makes (a call added to the client without a rule here fails this test)."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import yaml
from torchstep.kubernetes import MIN_KUBERNETES_VERSION
from torchstep.kubernetes.client import KubernetesClient

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"

#: Each call of the client protocol -> the (API group, resource, verb) it needs.
NEEDS = {
    "create_namespaced_job": ("batch", "jobs", "create"),
    "read_namespaced_job_status": ("batch", "jobs/status", "get"),
    "patch_namespaced_job": ("batch", "jobs", "patch"),
    "delete_collection_namespaced_job": ("batch", "jobs", "deletecollection"),
    "create_namespaced_pod": ("", "pods", "create"),
    "read_namespaced_pod_status": ("", "pods/status", "get"),
    "patch_namespaced_pod": ("", "pods", "patch"),
    "list_namespaced_pod": ("", "pods", "list"),
    "read_namespaced_pod_log": ("", "pods/log", "get"),
    "delete_collection_namespaced_pod": ("", "pods", "deletecollection"),
    "create_namespaced_service": ("", "services", "create"),
    "list_namespaced_service": ("", "services", "list"),
    "delete_namespaced_service": ("", "services", "delete"),
    "create_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "create"),
    "delete_collection_namespaced_network_policy": ("networking.k8s.io", "networkpolicies", "deletecollection"),
}


def rbac_objects() -> list[dict]:
    text = DOC.read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, re.S)
    return [o for block in blocks for o in yaml.safe_load_all(block) if o and "rbac" in o.get("apiVersion", "")]


def test_the_rbac_example_validates_strictly() -> None:
    objects = rbac_objects()
    assert [o["kind"] for o in objects] == ["Role", "RoleBinding", "Role", "RoleBinding"]
    for obj in objects:
        kubernetes_validate.validate(obj, MIN_KUBERNETES_VERSION, strict=True)


def test_the_runner_role_grants_every_call_the_client_makes_and_the_viewer_none_that_writes() -> None:
    calls = {n for n in vars(KubernetesClient) if not n.startswith("_") and n != "sanitize"}
    assert calls == set(NEEDS)  # a new client call needs a rule in docs/security.md
    runner, _, viewer, _ = rbac_objects()
    granted = {
        (g, r, v)
        for rule in runner["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }
    assert set(NEEDS.values()) <= granted
    writes = {"create", "patch", "update", "delete", "deletecollection"}
    assert not {v for rule in viewer["rules"] for v in rule["verbs"]} & writes
