"""Fixtures of the one-machine cluster (tests/cluster): ``real_cluster`` starts the API server
of ``tests/kubehttp.py`` in ``--real`` mode, whose pods run for real (see
``cluster/kubelet.py`` and ``cluster/controller.py``), and removes everything it made — pods,
dnsmasq, network namespaces, cgroups — even when the test fails or the server crashed.

The cluster needs root, network namespaces, bubblewrap, dnsmasq and a writable cgroup v1
memory controller. Where one is missing the tests skip and say which; under CI
(``CI=true``, which ``.ci/run`` sets) that skip is a failure instead, so a CI machine that
cannot run them never passes silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubehttp import start_server

from cluster.controller import new_prefix
from cluster.harness import REPO, Cluster, cluster_config, require_cluster
from cluster.kubelet import cleanup


@pytest.fixture
def real_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A fresh one-machine cluster with two nodes; everything it made is removed afterwards."""
    require_cluster()
    prefix = new_prefix()
    root = tmp_path / "cluster"
    server = start_server(tmp_path / "api", real=cluster_config(root, prefix))
    try:
        yield Cluster(server, root, prefix=prefix)
    finally:
        server.stop()
        cleanup(prefix, root)  # what a crashed or killed server left


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for every test of a module (as ``real_cluster``): for tests whose runs
    name their objects apart and delete them, so each does not pay for a cluster's start."""
    require_cluster()
    prefix = new_prefix()
    tmp = tmp_path_factory.mktemp("cluster")
    root = tmp / "cluster"
    server = start_server(tmp / "api", real=cluster_config(root, prefix))
    try:
        yield Cluster(server, root, prefix=prefix)
    finally:
        server.stop()
        cleanup(prefix, root)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
