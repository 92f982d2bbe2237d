"""Fakes of the cncf-kubernetes provider's API seams, shared by the Airflow tests (no cluster here)."""

from __future__ import annotations


class FakeHook:
    """What KubernetesPodOperator 10.5 reads from its hook while building a pod."""

    is_in_cluster = False

    def get_namespace(self):
        return None

    def get_xcom_sidecar_container_image(self):
        return "alpine"

    def get_xcom_sidecar_container_resources(self):
        return None
