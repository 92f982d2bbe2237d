"""The agent alone on a really full disk (a 256 KiB tmpfs, full before it starts): its
workers never see a write error (their output goes through the agent's pipes), the console
keeps every line, the root cause's tail is complete, and the exit status is the step's own
(issue 23, item 1). torchstep's launcher side: tests/local/test_full_disk.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from agent_testlib import Agents
from fulldisk import NO_SPACE, fill, full_tmpfs

LINES = 2048


def script(tmp_path: Path, fail: bool) -> str:
    path = tmp_path / ("fails.py" if fail else "succeeds.py")
    path.write_text(
        "import sys\n"
        f"for i in range({LINES}):\n"
        "    sys.stdout.write(f'line {i:05d} ' + 'x' * 1012 + '\\n')\n"
        + ("raise ValueError('MARKER on a full disk')\n" if fail else "")
    )
    return str(path)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "fails"])
def test_on_a_full_log_dir_the_agent_ends_with_the_workers_outcome(agents: Agents, tmp_path: Path, fail: bool) -> None:
    with full_tmpfs(tmp_path / "full") as full:
        fill(full)
        a = agents.run(["--log-dir", str(full), "--nproc-per-node", "1", script(tmp_path, fail)], files=False)
        assert a.returncode == (1 if fail else 0), a.diagnostics()
        numbered = [int(m.group(1)) for m in re.finditer(r"^line (\d{5}) x{1012}$", a.stdout, re.M)]
        assert numbered == list(range(LINES))  # the worker was never stopped by the disk
        assert f"log truncated: {full}/agent.log: {NO_SPACE}" in a.stderr
        assert re.search(rf"log truncated: {full}/\S+/attempt_0/0/stdout.log: {NO_SPACE}", a.stderr), a.stderr
        assert f"cannot write the result to {full}/result.json: {NO_SPACE}" in a.stderr
        last = [line for line in a.stderr.splitlines() if line.startswith("[torchstep-agent ")][-1]
        if fail:  # the tail the pipe kept, though the log file holds none of it
            assert "rank 0 worker_failed (exit 1): ValueError: MARKER on a full disk" in last
        assert "Traceback" not in a.stderr.split("ChildFailedError")[0] or fail


@pytest.mark.timeout(300)
def test_a_result_file_on_a_full_disk_reaches_its_reader_by_the_termination_log(agents: Agents, tmp_path: Path) -> None:
    """``--result-file`` cannot be written: exit 83 when nothing else carries the result (a
    caller must not see success without it); with a termination log elsewhere (what the
    local supervisor and Kubernetes read) the step's own exit 0 and a summary that says why."""
    with full_tmpfs(tmp_path / "full") as full:
        fill(full)
        argv = [
            "--result-file",
            str(full / "result.json"),
            "--log-dir",
            str(tmp_path / "logs"),
            "--nproc-per-node",
            "1",
        ]
        alone = agents.run([*argv, script(tmp_path, False)], files=False, name="alone")
        summary = tmp_path / "summary.json"
        read = agents.run(
            [*argv, script(tmp_path, False)], files=False, name="read", env={"TORCHSTEP_TERMINATION_LOG": str(summary)}
        )
    assert alone.returncode == 83, alone.diagnostics()
    assert read.returncode == 0, read.diagnostics()
    data = json.loads(summary.read_text())
    assert data["state"] == "SUCCEEDED" and data["exit_code"] == 0
    assert f"result not written: {full}/result.json: {NO_SPACE}" in data["warnings"]
    copy = json.loads((tmp_path / "logs" / "result.json").read_text())  # the copy that could be written says so
    assert f"result not written: {full}/result.json: {NO_SPACE}" in copy["warnings"]
