"""Nothing of a cluster outlives it: a stopped server removes its pods, DNS, namespaces and
cgroups, and the fixture's cleanup by name prefix removes what a SIGKILLed server left."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from kubehttp import start_server

from cluster.controller import new_prefix
from cluster.harness import Cluster, cluster_config, require_cluster
from cluster.kubelet import cleanup, list_netns, memory_cgroup_root


def processes(prefix: str) -> set[int]:
    """Every process in the cluster's cgroups (its pods' and dnsmasq)."""
    pids: set[int] = set()
    for procs in (memory_cgroup_root() / f"{prefix}pods").glob("*/cgroup.procs"):
        pids |= {int(p) for p in procs.read_text().split()}
    return pids


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def leftovers(prefix: str, pids: set[int]) -> list[str]:
    """This cluster's namespaces, cgroups and processes still on the machine."""
    found = [f"netns {n}" for n in list_netns() if n.startswith(prefix)]
    cgroups = memory_cgroup_root() / f"{prefix}pods"
    if cgroups.exists():
        found.append(f"cgroup {cgroups.name}")
    return found + [f"process {pid}" for pid in sorted(pids) if alive(pid)]


def test_a_sigkilled_api_server_leaves_nothing_after_the_cleanup(tmp_path: Path) -> None:
    require_cluster()
    prefix = new_prefix()
    root = tmp_path / "cluster"
    server = start_server(tmp_path / "api", real=cluster_config(root, prefix))
    try:
        cluster = Cluster(server, root)
        cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "long"},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "x", "command": ["sh", "-c", "echo up; sleep 300"]}],
                },
            }
        )
        cluster.wait(lambda: "up" in cluster.log("long"), 60, "the pod to run")
        pids = processes(prefix)
        assert len(pids) >= 2  # dnsmasq and the pod's processes
        assert f"{prefix}p1" in list_netns() and len(leftovers(prefix, pids)) >= 4
        os.killpg(server.process.pid, signal.SIGKILL)  # no chance to clean up after itself
        server.process.wait()
    finally:
        server.stop()
        cleanup(prefix, root)
    deadline = time.monotonic() + 30
    while leftovers(prefix, pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert leftovers(prefix, pids) == []
