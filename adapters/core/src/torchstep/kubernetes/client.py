"""The Kubernetes API calls :class:`~torchstep.kubernetes.JobGang` makes, as a small
protocol, and its default implementation over the official ``kubernetes`` client
(``pip install "torchstep[kubernetes]"``).

The names and arguments are the official client's (``CoreV1Api`` / ``BatchV1Api``), so an
adapter hands in whatever client its orchestrator already configured (Airflow's
``KubernetesHook``, a Prefect block, the in-cluster config of a KFP launcher pod) and tests
use one recorded fake (``tests/kubefake.py``).

Example::

    from kubernetes import client, config
    config.load_kube_config()
    api = client.ApiClient()
    kube = OfficialClient(core=client.CoreV1Api(api), batch=client.BatchV1Api(api), api_client=api)
    JobGang(rendered, kube).run()
"""

from __future__ import annotations

from typing import Any, Protocol


class KubernetesClient(Protocol):
    """Exactly the calls a :class:`~torchstep.kubernetes.JobGang` uses (official client names).
    An API error carries its HTTP status as ``.status`` (409: exists, 404: not found), as
    the official client's ``ApiException`` does."""

    def create_namespaced_job(self, namespace: str, body: Any) -> Any: ...
    def read_namespaced_job_status(self, name: str, namespace: str) -> Any: ...
    def patch_namespaced_job(self, name: str, namespace: str, body: Any) -> Any: ...
    def delete_collection_namespaced_job(self, namespace: str, **kwargs: Any) -> Any: ...
    def create_namespaced_pod(self, namespace: str, body: Any) -> Any: ...
    def read_namespaced_pod_status(self, name: str, namespace: str) -> Any: ...
    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any: ...
    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...
    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def delete_collection_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any: ...
    def create_namespaced_service(self, namespace: str, body: Any) -> Any: ...
    def list_namespaced_service(self, namespace: str, **kwargs: Any) -> Any: ...
    def delete_namespaced_service(self, name: str, namespace: str, **kwargs: Any) -> Any: ...
    def sanitize(self, obj: Any) -> dict[str, Any]:
        """An API object (or dict) as a plain dict (``ApiClient.sanitize_for_serialization``)."""
        ...


class OfficialClient:
    """:class:`KubernetesClient` over the official client's ``CoreV1Api`` (``core``),
    ``BatchV1Api`` (``batch``) and ``ApiClient`` (``api_client``)."""

    _BATCH = frozenset(
        {
            "create_namespaced_job",
            "read_namespaced_job_status",
            "patch_namespaced_job",
            "delete_collection_namespaced_job",
        }
    )

    def __init__(self, *, core: Any, batch: Any, api_client: Any = None) -> None:
        self.core = core
        self.batch = batch
        self.api_client = api_client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.batch if name in self._BATCH else self.core, name)

    def sanitize(self, obj: Any) -> dict[str, Any]:
        if isinstance(obj, dict):
            return obj
        if self.api_client is None:
            from kubernetes.client import ApiClient

            self.api_client = ApiClient()
        return dict(self.api_client.sanitize_for_serialization(obj))

    @classmethod
    def from_config(
        cls, *, config_file: str | None = None, context: str | None = None, in_cluster: bool | None = None
    ) -> OfficialClient:
        """The default client: in-cluster config inside a pod (or when ``in_cluster``), else
        the kubeconfig (``config_file``/``context``, default ``~/.kube/config``)."""
        try:
            from kubernetes import client, config
        except ImportError as e:  # pragma: no cover - depends on the extra
            raise ImportError(
                'the kubernetes target needs the official client: pip install "torchstep[kubernetes]"'
            ) from e
        import os

        if in_cluster or (in_cluster is None and os.environ.get("KUBERNETES_SERVICE_HOST")):
            config.load_incluster_config()
        else:
            config.load_kube_config(config_file=config_file, context=context)
        api = client.ApiClient()
        return cls(core=client.CoreV1Api(api), batch=client.BatchV1Api(api), api_client=api)
