"""Fakes of the cncf-kubernetes provider's API seams, shared by the Airflow tests (no cluster here)."""

from __future__ import annotations

from types import SimpleNamespace


class FakeHook:
    """What KubernetesPodOperator 10.5 reads from its hook while building a pod."""

    is_in_cluster = False

    def get_namespace(self):
        return None

    def get_xcom_sidecar_container_image(self):
        return "alpine"

    def get_xcom_sidecar_container_resources(self):
        return None


class FakePodManager(FakeHook):
    """KubernetesPodOperator's pod manager for pods that are finished when created (``pods``:
    by name): its waits return at once, its reads answer from ``pods``."""

    pods: dict

    def read_pod(self, pod):
        return self.pods[pod.metadata.name]

    def await_pod_start(self, pod, **kwargs):
        pass

    def fetch_requested_container_logs(self, pod, **kwargs):
        return []

    def await_container_completion(self, pod, **kwargs):
        pass

    def await_xcom_sidecar_container_start(self, pod):
        pass

    def await_pod_completion(self, pod, istio_enabled=False, container_name="main"):
        return self.pods[pod.metadata.name]

    def read_pod_events(self, pod):
        return SimpleNamespace(items=[])
