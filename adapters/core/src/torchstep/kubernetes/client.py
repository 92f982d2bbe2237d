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

    def create_namespaced_job(self, namespace: str, body: Any) -> Any:
        """Create a Job (``BatchV1Api``).

        Args:
            namespace: the Job's namespace.
            body: the Job, a dict as rendered.

        Returns:
            The Job as the API server created it (with its ``metadata.uid``).
        """
        ...

    def read_namespaced_job_status(self, name: str, namespace: str) -> Any:
        """Read a Job with its status.

        Args:
            name: the Job's name.
            namespace: its namespace.

        Returns:
            The Job.
        """
        ...

    def patch_namespaced_job(self, name: str, namespace: str, body: Any) -> Any:
        """Patch a Job (the log cursor annotation).

        Args:
            name: the Job's name.
            namespace: its namespace.
            body: a merge patch.

        Returns:
            The patched Job.
        """
        ...

    def delete_collection_namespaced_job(self, namespace: str, **kwargs: Any) -> Any:
        """Delete the Jobs a ``label_selector`` keyword selects (``propagation_policy`` too).

        Args:
            namespace: the Jobs' namespace.
            **kwargs: the official client's keywords.

        Returns:
            The API server's answer.
        """
        ...

    def create_namespaced_pod(self, namespace: str, body: Any) -> Any:
        """Create a bare Pod.

        Args:
            namespace: the Pod's namespace.
            body: the Pod, a dict as rendered.

        Returns:
            The Pod as the API server created it (with its ``metadata.uid``).
        """
        ...

    def read_namespaced_pod_status(self, name: str, namespace: str) -> Any:
        """Read a Pod with its status.

        Args:
            name: the Pod's name.
            namespace: its namespace.

        Returns:
            The Pod.
        """
        ...

    def patch_namespaced_pod(self, name: str, namespace: str, body: Any) -> Any:
        """Patch a Pod (the log cursor annotation of a bare Pod).

        Args:
            name: the Pod's name.
            namespace: its namespace.
            body: a merge patch.

        Returns:
            The patched Pod.
        """
        ...

    def list_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        """List the Pods a ``label_selector`` keyword selects.

        Args:
            namespace: the Pods' namespace.
            **kwargs: the official client's keywords.

        Returns:
            A list object whose ``items`` are the Pods.
        """
        ...

    def read_namespaced_pod_log(self, name: str, namespace: str, **kwargs: Any) -> Any:
        """Read (or, with ``follow`` and ``_preload_content=False``, stream) a Pod's log.

        Args:
            name: the Pod's name.
            namespace: its namespace.
            **kwargs: the official client's keywords (``container``, ``since_seconds``...).

        Returns:
            The log text, or a stream of bytes chunks.
        """
        ...

    def delete_collection_namespaced_pod(self, namespace: str, **kwargs: Any) -> Any:
        """Delete the Pods a ``label_selector`` keyword selects.

        Args:
            namespace: the Pods' namespace.
            **kwargs: the official client's keywords.

        Returns:
            The API server's answer.
        """
        ...

    def create_namespaced_service(self, namespace: str, body: Any) -> Any:
        """Create a Service.

        Args:
            namespace: the Service's namespace.
            body: the Service, a dict as rendered.

        Returns:
            The Service as the API server created it.
        """
        ...

    def list_namespaced_service(self, namespace: str, **kwargs: Any) -> Any:
        """List the Services a ``label_selector`` keyword selects.

        Args:
            namespace: the Services' namespace.
            **kwargs: the official client's keywords.

        Returns:
            A list object whose ``items`` are the Services.
        """
        ...

    def delete_namespaced_service(self, name: str, namespace: str, **kwargs: Any) -> Any:
        """Delete one Service.

        Args:
            name: the Service's name.
            namespace: its namespace.
            **kwargs: the official client's keywords.

        Returns:
            The API server's answer.
        """
        ...

    def create_namespaced_network_policy(self, namespace: str, body: Any) -> Any:
        """Create a NetworkPolicy (``NetworkingV1Api``).

        Args:
            namespace: the NetworkPolicy's namespace.
            body: the NetworkPolicy, a dict as rendered.

        Returns:
            The NetworkPolicy as the API server created it.
        """
        ...

    def delete_collection_namespaced_network_policy(self, namespace: str, **kwargs: Any) -> Any:
        """Delete the NetworkPolicies a ``label_selector`` keyword selects (``NetworkingV1Api``).

        Args:
            namespace: the NetworkPolicies' namespace.
            **kwargs: the official client's keywords.

        Returns:
            The API server's answer.
        """
        ...

    def sanitize(self, obj: Any) -> dict[str, Any]:
        """An API object (or dict) as a plain dict (``ApiClient.sanitize_for_serialization``).

        Args:
            obj: an object the client returned, or a dict (returned as it is).

        Returns:
            The object as JSON-like data.
        """
        ...


class OfficialClient:
    """:class:`KubernetesClient` over the official client's ``CoreV1Api`` (``core``),
    ``BatchV1Api`` (``batch``), ``NetworkingV1Api`` (``networking``) and ``ApiClient``
    (``api_client``).

    Args:
        core: a ``kubernetes.client.CoreV1Api`` (Pods, Services, logs).
        batch: a ``kubernetes.client.BatchV1Api`` (Jobs).
        api_client: the ``ApiClient`` used to sanitise objects; ``None``: a default one
            when first needed.
        networking: a ``kubernetes.client.NetworkingV1Api`` (NetworkPolicies); ``None``:
            one over ``core``'s ``ApiClient`` when first needed.
    """

    _BATCH = frozenset(
        {
            "create_namespaced_job",
            "read_namespaced_job_status",
            "patch_namespaced_job",
            "delete_collection_namespaced_job",
            "list_namespaced_job",
        }
    )

    def __init__(self, *, core: Any, batch: Any, api_client: Any = None, networking: Any = None) -> None:
        self.core = core
        self.batch = batch
        self.api_client = api_client
        self.networking = networking

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name.endswith("_network_policy"):
            if self.networking is None:
                if hasattr(self.core, name):  # one object that serves every API (a recorded fake)
                    return getattr(self.core, name)
                from kubernetes.client import NetworkingV1Api

                self.networking = NetworkingV1Api(getattr(self.core, "api_client", None) or self.api_client)
            return getattr(self.networking, name)
        return getattr(self.batch if name in self._BATCH else self.core, name)

    def watch(
        self, kind: str, namespace: str, *, label_selector: str, resource_version: str | None, timeout_seconds: int
    ) -> OfficialWatch:
        """Watch the Pods or Jobs ``label_selector`` selects (``kubernetes.watch.Watch``), from
        ``resource_version``, for at most ``timeout_seconds``.

        Args:
            kind: ``Pod`` or ``Job``.
            namespace: their namespace.
            label_selector: the run's labels.
            resource_version: where to start (a list's ``resourceVersion``); ``None``: now,
                after a synthetic ``ADDED`` of every object.
            timeout_seconds: when the server ends the request.

        Returns:
            The open stream (its ``close()`` ends it from another thread).

        Raises:
            ValueError: ``kind`` is neither ``Pod`` nor ``Job``.
        """
        if kind not in ("Pod", "Job"):
            raise ValueError(f"watch: kind {kind!r}; fix: Pod or Job")
        fn = self.core.list_namespaced_pod if kind == "Pod" else self.batch.list_namespaced_job
        kwargs: dict[str, Any] = {
            "label_selector": label_selector,
            "timeout_seconds": timeout_seconds,
            "allow_watch_bookmarks": True,
        }
        if resource_version is not None:
            kwargs["resource_version"] = resource_version
        return OfficialWatch(fn, namespace, kwargs)

    def sanitize(self, obj: Any) -> dict[str, Any]:
        """An API object (or dict) as a plain dict (``ApiClient.sanitize_for_serialization``).

        Args:
            obj: an object the client returned, or a dict (returned as it is).

        Returns:
            The object as JSON-like data.
        """
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
        the kubeconfig.

        Args:
            config_file: the kubeconfig file; ``None``: ``$KUBECONFIG`` or ``~/.kube/config``.
            context: the kubeconfig context; ``None``: its current context.
            in_cluster: ``True``: the pod's service account; ``None``: in-cluster when
                ``KUBERNETES_SERVICE_HOST`` is set.

        Returns:
            A client over one ``ApiClient``.

        Raises:
            ImportError: the ``kubernetes`` package is not installed (``torchstep[kubernetes]``).
            kubernetes.config.ConfigException: no usable configuration was found.
        """
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
            # $KUBECONFIG as it is now: the package reads it once, when first imported, so a
            # process that set it later (a worker given a cluster per task) would get ~/.kube/config
            if config_file is None:
                config_file = os.environ.get("KUBECONFIG") or None
            config.load_kube_config(config_file=config_file, context=context)
        api = client.ApiClient()
        return cls(
            core=client.CoreV1Api(api),
            batch=client.BatchV1Api(api),
            api_client=api,
            networking=client.NetworkingV1Api(api),
        )


class OfficialWatch:
    """One watch request through ``kubernetes.watch.Watch().stream`` (events as it yields
    them), which :meth:`close` ends from another thread: the blocked read of the stream is
    woken by shutting its socket down (closing alone would not wake it).

    Args:
        fn: the list call (``list_namespaced_pod`` / ``list_namespaced_job``).
        namespace: the objects' namespace.
        kwargs: the watch's keywords (``label_selector``, ``resource_version``, ``timeout_seconds``...).
    """

    def __init__(self, fn: Any, namespace: str, kwargs: dict[str, Any]) -> None:
        from kubernetes import watch

        from torchstep.kubernetes.watch import WATCH_READ_TIMEOUT_S

        self._watch = watch.Watch()
        self._response: Any = None

        def call(*args: Any, **kw: Any) -> Any:  # keeps the response, to shut it down
            self._response = fn(*args, **kw)
            return self._response

        call.__doc__ = fn.__doc__  # Watch reads the object type from the list call's docstring
        kwargs = {**kwargs, "_request_timeout": (10.0, WATCH_READ_TIMEOUT_S)}
        self._events = self._watch.stream(call, namespace, **kwargs)

    def __iter__(self) -> Any:
        return self._events

    def close(self) -> None:
        """End the stream now (from any thread)."""
        self._watch.stop()
        response = self._response
        if response is None:
            return
        shutdown = getattr(response, "shutdown", None)  # urllib3 >= 2.3
        if callable(shutdown):
            shutdown()
            return
        import socket

        sock = getattr(getattr(response, "connection", None), "sock", None)  # urllib3 1.26
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass
