"""What a test of the one-machine cluster holds: :class:`Cluster` (the API server's URL and
small helpers to create, read, wait for and delete objects), the machine check
(:func:`missing`, :func:`require_cluster`) and the server's configuration
(:func:`cluster_config`). The fixtures are in ``conftest.py``."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubehttp import KubeServer

from cluster.kubelet import memory_cgroup_root

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def missing() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "the one-machine cluster needs root on Linux (network, PID and mount namespaces)"
    for tool, package in (
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("bwrap", "bubblewrap"),
        ("dnsmasq", "dnsmasq-base"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install {package} (tools/system-deps.sh does it)"
    try:
        probe = memory_cgroup_root() / f"tsprobe{os.getpid()}"
        probe.mkdir()
        probe.rmdir()
    except (OSError, RuntimeError) as e:
        return f"no writable cgroup v1 memory controller: {e}"
    name = f"tsprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return None


def require_cluster() -> None:
    """Skip (fail under CI) when the machine cannot run the cluster."""
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI must run the one-machine cluster tests: {reason}")
    pytest.skip(reason)


class Cluster:
    """A running one-machine cluster, as a test sees it."""

    def __init__(self, server: KubeServer, root: Path, namespace: str = "ml", prefix: str = "") -> None:
        self.server = server
        self.root = root
        self.namespace = namespace
        self.prefix = prefix  # the cluster's name prefix (its namespaces and cgroups)

    def pod_processes(self) -> set[int]:
        """The live processes of every pod of the cluster (each pod's cgroup; dnsmasq's is not
        a pod's): empty once every pod's processes have ended."""
        if not self.prefix:
            raise ValueError("Cluster(prefix=...) is needed to find the pods' processes")
        pids: set[int] = set()
        for procs in (memory_cgroup_root() / f"{self.prefix}pods").glob("p[0-9]*/cgroup.procs"):
            try:
                pids |= {int(pid) for pid in procs.read_text().split()}
            except OSError:  # the pod's group went meanwhile: its processes had ended
                continue
        return {pid for pid in pids if _alive(pid)}

    @property
    def kubeconfig(self) -> Path:
        return self.server.kubeconfig

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One call of the API server (``path`` under the server's URL)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.server.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as r:
                return dict(json.loads(r.read()))
        except urllib.error.HTTPError as e:
            return dict(json.loads(e.read()))

    def path(self, kind: str, name: str | None = None) -> str:
        group = {"jobs": "/apis/batch/v1", "networkpolicies": "/apis/networking.k8s.io/v1"}.get(kind, "/api/v1")
        return f"{group}/namespaces/{self.namespace}/{kind}" + (f"/{name}" if name else "")

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        kind = {"Pod": "pods", "Job": "jobs", "Service": "services", "NetworkPolicy": "networkpolicies"}[obj["kind"]]
        return self.api("POST", self.path(kind), obj)

    def get(self, kind: str, name: str) -> dict[str, Any]:
        return self.api("GET", self.path(kind, name))

    def items(self, kind: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={urllib.parse.quote(selector)}" if selector else ""
        return list(self.api("GET", self.path(kind) + query)["items"])

    def delete(self, kind: str, name: str, **options: Any) -> dict[str, Any]:
        return self.api("DELETE", self.path(kind, name), options or None)

    def log(self, pod: str, query: str = "") -> str:
        with urllib.request.urlopen(f"{self.server.url}{self.path('pods', pod)}/log{query}", timeout=60) as r:
            return str(r.read().decode())

    def wait(self, what: Callable[[], Any], timeout: float = 90.0, message: str = "") -> Any:
        """Poll ``what`` until it returns something true; its last value, or fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            value = what()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:.0f} s: {message or what} (last: {value!r})")
            time.sleep(0.1)

    def pod_done(self, name: str, timeout: float = 90.0) -> dict[str, Any]:
        """The pod once it has ended (Succeeded or Failed)."""
        return dict(
            self.wait(
                lambda: (p := self.get("pods", name)).get("status", {}).get("phase") in ("Succeeded", "Failed") and p,
                timeout,
                f"pod {name} to end",
            )
        )

    def job_done(self, name: str, timeout: float = 120.0) -> dict[str, Any]:
        """The Job once it has a Complete or Failed condition."""

        def done() -> Any:
            job = self.get("jobs", name)
            kinds = {c["type"] for c in job.get("status", {}).get("conditions") or [] if c["status"] == "True"}
            return job if kinds & {"Complete", "Failed"} else None

        return dict(self.wait(done, timeout, f"Job {name} to finish"))

    def start_pod(
        self,
        name: str,
        command: list[str],
        node: str | None = None,
        container: dict[str, Any] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        """Create a bare pod (restartPolicy Never) whose one container runs ``command``, on
        ``node`` when given (its ``kubernetes.io/hostname`` selector); ``container`` and
        ``spec`` add to the container and the pod's spec. Returns the created pod."""
        body = {
            "restartPolicy": "Never",
            **({"nodeSelector": {"kubernetes.io/hostname": node}} if node else {}),
            "containers": [{"name": "main", "image": "onemachine", "command": command, **(container or {})}],
            **spec,
        }
        made = self.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": body})
        assert made.get("kind") == "Pod", made
        return made

    def exec_pod(self, argv: list[str], **fields: Any) -> dict[str, Any]:
        """Run ``argv`` as a bare pod's container (restartPolicy Never) and return it once ended."""
        name = fields.pop("name", f"probe-{os.urandom(3).hex()}")
        self.start_pod(name, argv, container=fields.pop("container", None), **fields)
        return self.pod_done(name)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def cluster_config(root: Path, prefix: str, nodes: int = 2) -> dict[str, Any]:
    venv = REPO / ".venv" / "bin"
    return {
        "root": str(root),
        "prefix": prefix,
        "nodes": [f"node-{i}" for i in range(nodes)],
        "path": f"{venv}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "node_grace_s": 2.0,
    }
