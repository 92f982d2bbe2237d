"""Rendezvous through a real etcd server (Debian's etcd-server, started on free loopback
ports with the v2 API that torch's etcd backends use)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator

import pytest
from agent_testlib import WORKER, Agents
from netlib import free_port
from proclib import wait_for

ETCD = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)


@pytest.fixture
def etcd(tmp_path) -> Iterator[str]:
    if ETCD is None:
        pytest.skip("etcd is not installed (`make system-deps` installs Debian's etcd-server)")
    pytest.importorskip("etcd", reason="python-etcd is needed by torch's etcd rendezvous backends")
    client, peer = free_port(), free_port()
    proc = subprocess.Popen(
        [
            ETCD,
            "--name",
            "t",
            "--data-dir",
            str(tmp_path / "etcd"),
            "--enable-v2=true",
            "--listen-client-urls",
            f"http://127.0.0.1:{client}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{client}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"t=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "etcd.log", "w"),
        start_new_session=True,
    )

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{client}/v2/keys", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_for(ready, 30, "etcd to serve the v2 API")
        yield f"127.0.0.1:{client}"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("backend", ["etcd-v2", "etcd"])
def test_two_agents_rendezvous_through_etcd(agents: Agents, etcd: str, backend: str) -> None:
    args = [
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--rdzv-backend",
        backend,
        "--rdzv-endpoint",
        etcd,
        "--rdzv-id",
        f"etcd-{backend}",
        WORKER,
        "--mode",
        "env",
    ]
    pair = [agents.start(args, name=f"node{i}") for i in range(2)]
    for a in pair:
        assert a.wait(120) == 0, a.diagnostics()
    ranks = []
    for a in pair:
        (k,) = a.result["replicas"][0]["ranks"]
        env = json.loads(next(x for x in open(k["log_file"]) if x.startswith("ENV "))[4:])
        ranks.append((env["RANK"], env["WORLD_SIZE"]))
    assert sorted(ranks) == [("0", "2"), ("1", "2")]
