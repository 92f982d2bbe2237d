"""torchstep.agent.procs, the product's process-tree module, and the agent's reaper it starts
(run isolated): when the agent dies without saying ``done``, the reaper kills the watched
worker groups and marks a RUNNING result FAILED with torchstep's one atomic writer (a private
file, replaced whole)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from proclib import wait_for
from torchstep.agent.procs import Reaper, pid_alive


def test_an_agent_that_dies_leaves_killed_workers_and_a_failed_result(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"state": "RUNNING", "started_at": 1.0, "replicas": [{"state": "RUNNING"}]}))
    worker = subprocess.Popen(["sleep", "300"], start_new_session=True)
    reaper = Reaper(results=[str(result)], run_dir=None)
    reaper.start()
    try:
        reaper.watch_group(worker.pid)
        proc = reaper._proc
        assert proc is not None and proc.stdin is not None
        proc.stdin.close()  # what the kernel does when the agent is SIGKILLed
        proc.wait(60)
        assert worker.wait(60) == -9
        data = json.loads(result.read_text())
        assert data["state"] == "FAILED" and data["exit_code"] == 137
        assert "the agent died without writing a result" in data["message"]
        assert data["replicas"][0]["state"] == "FAILED"
        assert stat.S_IMODE(os.stat(result).st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # no temp file left
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_finished_agent_leaves_its_result_alone(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"state": "RUNNING"}))
    reaper = Reaper(results=[str(result)], run_dir=None)
    reaper.start()
    pid = reaper.pid
    reaper.finish()
    assert pid is not None
    wait_for(lambda: not pid_alive(pid), 60, "the reaper to exit")
    assert json.loads(result.read_text()) == {"state": "RUNNING"}  # "done": the agent wrote its own result


def test_the_process_tree_modules_examples_run() -> None:
    import doctest

    import torchstep.agent.procs

    result = doctest.testmod(torchstep.agent.procs, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
