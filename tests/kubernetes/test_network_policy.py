"""Each multi-replica role's NetworkPolicy (issue 33): torch's rendezvous and worker stores
have no authentication, so only the run's own pods may reach a role's pods, on any port (the
stores and gloo/NCCL pick ports at run time); the role's other declared ports stay open to
all. Checked as the API server stores it (the HTTP fake, the official client), created and
deleted with the Job, and by playing the stranger against the policy's own rules (no network
plugin enforces anything here: docs/security.md says what a cluster without one leaves open).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import torchstep
from kubefake import FakeKube, Script
from kubehttp import Scenario, start_server
from torchstep.errors import RunError
from torchstep.kubernetes import MIN_KUBERNETES_VERSION, JobGang, OfficialClient, render_app
from torchx import specs

RDZV_PORT = 29500
WORKER_PORT = 47123  # any port: the workers' store and gloo pick theirs at run time


def _app(*, port_map: dict[str, int] | None = None, replicas: int = 2) -> Any:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        num_replicas=replicas,
        port_map=port_map or {},
        metadata={"torchstep": {"nproc_per_node": 1}},
    )
    return specs.AppDef("train", roles=[role])


def _admits(policy: dict[str, Any], peer_labels: dict[str, str], port: int) -> bool:
    """Whether ``policy`` lets a pod labelled ``peer_labels`` (same namespace) connect to
    ``port`` of a pod it selects — the NetworkPolicy rules of networking.k8s.io/v1 for what
    the rendered policies use (podSelector peers, TCP port lists)."""
    for rule in policy["spec"].get("ingress", []):
        peers = rule.get("from")
        peer_ok = peers is None or any(
            all(peer_labels.get(k) == v for k, v in p["podSelector"]["matchLabels"].items()) for p in peers
        )
        ports = rule.get("ports")
        port_ok = ports is None or any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports)
        if peer_ok and port_ok:
            return True
    return False


def _selects(policy: dict[str, Any], pod_labels: dict[str, str]) -> bool:
    return all(pod_labels.get(k) == v for k, v in policy["spec"]["podSelector"]["matchLabels"].items())


def test_a_stranger_pod_reaches_no_store_of_a_multi_replica_role() -> None:
    rendered = render_app(_app(port_map={"tb": 6006}), namespace="ml", cfg={"run_id": "np-1"})
    (role,) = rendered.roles
    policy = role.network_policy
    assert policy is not None
    kubernetes_validate.validate(policy, MIN_KUBERNETES_VERSION, strict=True)
    pod = role.template["metadata"]["labels"]
    assert _selects(policy, pod)  # every replica of the role is behind it
    stranger = {"app": "curious", "torchstep/role": "trainer"}  # another workload, even of the same role name
    other_run = {**pod, "torchstep/app-id": "train-00000000"}  # another run of the same app
    for port in (RDZV_PORT, WORKER_PORT):
        assert _admits(policy, pod, port), port  # the run's own replicas rendezvous and train
        assert not _admits(policy, stranger, port), port
        assert not _admits(policy, other_run, port), port
    assert _admits(policy, stranger, 6006)  # the role's declared port is as open as before


def test_a_rendezvous_port_declared_in_port_map_is_not_opened_to_all() -> None:
    rendered = render_app(_app(port_map={"c10d": 29400, "tb": 6006}), namespace="ml", cfg={"run_id": "np-2"})
    policy = rendered.roles[0].network_policy
    assert rendered.roles[0].rdzv_endpoint.endswith(":29400")
    assert not _admits(policy, {"app": "curious"}, 29400)
    assert _admits(policy, {"app": "curious"}, 6006)


def test_one_replica_has_no_policy_its_stores_listen_on_loopback() -> None:
    rendered = render_app(_app(replicas=1), namespace="ml", cfg={"run_id": "np-3"})
    assert rendered.roles[0].network_policy is None
    assert [o["kind"] for o in rendered.objects] == ["Pod"]


def test_jobgang_creates_the_policy_owned_by_the_job_and_it_goes_with_it(tmp_path: Path) -> None:
    server = start_server(tmp_path / "api", Scenario(replicas=2, run_s=1, lines=2, line_interval_s=0.1))
    try:
        kube = OfficialClient.from_config(config_file=str(server.kubeconfig), in_cluster=False)
        rendered = render_app(_app(), namespace="ml", cfg={"run_id": "np-4"})
        name = rendered.roles[0].name
        gang = JobGang(rendered, kube, on_line=lambda line: None, poll_interval=0.2, on_finish="keep")
        result = gang.run()
        assert result.state == "SUCCEEDED", result
        stored = kube.sanitize(kube.read_namespaced_network_policy(name, "ml"))
        job = kube.sanitize(kube.read_namespaced_job_status(name, "ml"))
        assert [r["uid"] for r in stored["metadata"]["ownerReferences"]] == [job["metadata"]["uid"]]
        assert stored["spec"] == rendered.roles[0].network_policy["spec"]
        gang.delete()
        assert f"NetworkPolicy/{name}" in server.state()["deleted"]
        assert kube.list_namespaced_network_policy("ml", label_selector=rendered.label_selector).items == []
    finally:
        server.stop()


class _Forbidden(Exception):
    status, reason = 403, "Forbidden"
    body = '{"message": "networkpolicies.networking.k8s.io is forbidden: User \\"runner\\" cannot create"}'


class _NoPolicies(FakeKube):
    def create_namespaced_network_policy(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        raise _Forbidden()


def test_a_refused_policy_stops_the_run_with_the_fix_and_leaves_nothing() -> None:
    fake = _NoPolicies({0: Script(), 1: Script()})
    rendered = render_app(_app(), namespace="ml", cfg={"run_id": "np-5"})
    gang = JobGang(rendered, fake, on_line=lambda line: None, poll_interval=0.05)
    with pytest.raises(RunError) as e:
        gang.run()
    text = str(e.value)
    assert f"NetworkPolicy ml/{rendered.roles[0].name}" in text and "HTTP 403" in text
    assert "create networkpolicies in namespace ml (RBAC)" in text
    sel = rendered.label_selector
    assert ("jobs", sel, "Foreground") in fake.deleted  # the Job it had created is deleted


def test_the_policy_keeps_the_runs_labels_and_options(role: Any) -> None:
    app = specs.AppDef("a", [role(num_replicas=3)])
    rendered = render_app(app, namespace="ml", cfg={"run_id": "np-6", "labels": "team:ml"})
    policy = rendered.roles[0].network_policy
    assert policy["metadata"]["labels"]["team"] == "ml"
    assert policy["metadata"]["namespace"] == "ml" and policy["metadata"]["name"] == rendered.roles[0].name
    assert torchstep.kubernetes.render(app, namespace="ml", cfg={"run_id": "np-6"})[1]["kind"] == "NetworkPolicy"
