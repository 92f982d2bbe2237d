"""The agent's readiness file (``TORCHSTEP_READY_FILE``, what a rendered pod's readinessProbe
checks): present while the workers of a formed group run, rewritten for each group start,
gone once the agent exits; never written while the agent waits in the rendezvous."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from agent_testlib import Agents

WORKER = """\
import os, sys
ready = os.environ["TORCHSTEP_READY_FILE"]
attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
seen = open(ready).read().strip() if os.path.exists(ready) else "absent"
open(os.path.join(sys.argv[1], f"seen.{attempt}"), "w").write(seen)
sys.exit(3 if attempt == "0" else 0)
"""


def test_the_ready_file_exists_while_each_group_runs_and_goes_with_the_agent(agents: Agents, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ready = tmp_path / "ready"
    ready.write_text("left by an earlier agent\n")  # says nothing of this one: removed at its start
    a = agents.run(
        ["--nproc-per-node", "1", "--max-restarts", "1", str(script), str(tmp_path)],
        env={"TORCHSTEP_READY_FILE": str(ready)},
        timeout=120,
    )
    assert a.returncode == 0, a.diagnostics()
    assert a.result["state"] == "SUCCEEDED" and a.result["restarts"] == 1
    first, second = ((tmp_path / f"seen.{i}").read_text() for i in (0, 1))
    # each group start wrote it anew (its content is the time it was written)
    assert first != "absent" and second != "absent", (first, second)
    assert float(second) > float(first)
    assert not ready.exists()  # the agent is gone: not ready


def test_no_ready_file_while_the_agent_waits_in_the_rendezvous(agents: Agents, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ready = tmp_path / "ready"
    # a 2-node world whose second node never comes: the gang never forms
    a = agents.start(
        [
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--rdzv-id",
            "alone",
            str(script),
            str(tmp_path),
        ],
        env={"TORCHSTEP_READY_FILE": str(ready)},
    )
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline:
        assert a.returncode is None, a.diagnostics()
        assert not ready.exists()
        time.sleep(0.2)
    assert not list(tmp_path.glob("seen.*"))  # no worker started either
    a.kill()
