"""Elastic late join: two agents ``--nnodes 1:2`` on one c10d store, the second started
seconds after the first, form one job of 2 (torchrun does) — not two jobs of 1."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from proclib import wait_for

SCRIPTS = Path(__file__).resolve().parent / "scripts"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("delay", [3.0, 6.0])
def test_a_late_joiner_joins_the_running_job(tmp_path: Path, delay: float) -> None:
    port_file = tmp_path / "port"
    store = subprocess.Popen([sys.executable, str(SCRIPTS / "store.py"), str(port_file)])
    agents: list[subprocess.Popen[bytes]] = []
    out = tmp_path / "out"
    out.mkdir()
    try:
        wait_for(port_file.exists, 60, "the store")
        endpoint = f"127.0.0.1:{port_file.read_text()}"
        for i in range(2):
            if i:
                time.sleep(delay)
            agents.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "torchstep.agent",
                        "--nnodes",
                        "1:2",
                        "--nproc-per-node",
                        "1",
                        "--rdzv-backend",
                        "c10d",
                        "--rdzv-endpoint",
                        endpoint,
                        "--rdzv-conf",
                        "is_host=false",
                        "--rdzv-id",
                        "late",
                        "--max-restarts",
                        "1",
                        "--log-dir",
                        str(tmp_path / f"logs{i}"),
                        str(SCRIPTS / "joiner.py"),
                        str(out),
                        "2",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        codes = [a.wait(timeout=180) for a in agents]
    finally:
        for p in [*agents, store]:
            p.kill()
            p.wait()
    starts = {p.name: p.read_text() for p in out.iterdir()}
    assert codes == [0, 0], starts
    final = {name.split("-")[1]: size for name, size in starts.items() if size == "2"}
    assert sorted(final) == ["0", "1"], starts  # both group ranks ran in one world of 2
