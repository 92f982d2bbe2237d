"""A full log disk (a real 256 KiB tmpfs) never changes how a run ends: every file torchstep
writes during a run — rank logs, agent.log, console.log, each replica's result.json, the
run's result.json, the torchstep_local status record — survives ENOSPC; the run ends with
the step's own exit status, the console keeps every line, and the result (returned, printed
with ``--json``) names each file that was truncated or not written (issue 23, item 1)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from fulldisk import NO_SPACE, fill, full_tmpfs
from local_testlib import cli, role
from torchstep.local.appfile import app_to_dict
from torchx import specs

LINES = 2048  # 2 MiB of 1 KiB lines: eight times the disk
PRINT_2MIB = f"import sys\nfor i in range({LINES}):\n    sys.stdout.write(f'line {{i:05d}} ' + 'x' * 1012 + '\\n')\n"


def big_step(fail: bool) -> specs.AppDef:
    code = PRINT_2MIB + ("raise ValueError('MARKER after 2 MiB')\n" if fail else "print('done', flush=True)\n")
    return specs.AppDef("big", roles=[specs.Role("w", image="x", entrypoint="python", args=["-u", "-c", code])])


def warned(warnings: list[str], what: str, path_end: str) -> bool:
    return any(w.startswith(f"{what}: ") and w.split(": ")[1].endswith(path_end) and NO_SPACE in w for w in warnings)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fail", [False, True], ids=["succeeds", "fails"])
def test_torchstep_run_on_a_disk_that_fills_ends_with_the_steps_own_outcome(tmp_path: Path, fail: bool) -> None:
    """The issue's reproduction: ``torchstep run --log-dir FULL``, a step printing 2 MiB."""
    app_file = tmp_path / "app.json"
    app_file.write_text(json.dumps(app_to_dict(big_step(fail))))
    with full_tmpfs(tmp_path / "logs") as logs:
        p = subprocess.run(
            cli("--app", str(app_file), "--log-dir", str(logs), "--json"), capture_output=True, text=True, timeout=240
        )
        assert "Traceback" not in p.stderr and "OSError" not in p.stdout + p.stderr, p.stdout[-3000:] + p.stderr
        assert p.returncode == (1 if fail else 0), p.stdout[-3000:] + p.stderr
        result = json.loads(p.stdout[p.stdout.index("\n{\n") + 1 :])
        numbered = [int(m.group(1)) for m in re.finditer(r"^\[w/0\] line (\d{5}) x{1012}$", p.stdout, re.M)]
        assert numbered == list(range(LINES))  # the console kept every line, in order, once
        assert result["state"] == ("FAILED" if fail else "SUCCEEDED") and result["exit_code"] == (1 if fail else 0)
        assert result["retryable"] is fail
        warnings = result["warnings"]
        run_dir = result["log_dir"]
        assert warned(warnings, "log truncated", "/w/0/attempt_0/rank0.log"), warnings
        assert warned(warnings, "log truncated", "/w/0/console.log"), warnings
        assert warned(warnings, "result not written", "/w/0/result.json"), warnings  # the agent's
        assert f"result not written: {run_dir}/result.json: {NO_SPACE}" in warnings  # the run's
        if fail:  # the root cause's tail comes from the pipe, not from the truncated log file
            assert result["root_cause"]["tail"][-1] == "ValueError: MARKER after 2 MiB"
            assert "ValueError: MARKER after 2 MiB" in result["message"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("state", ["SUCCEEDED", "FAILED"])
def test_a_run_on_a_disk_full_from_the_start_names_every_file_it_could_not_write(tmp_path: Path, state: str) -> None:
    from torchstep.plan.planner import build_plan
    from torchstep.steps import LocalStep

    out = tmp_path / "out"
    out.mkdir()
    r = role("trainer", ["report", str(out)])
    if state == "FAILED":
        code = "print('about to fail', flush=True)\nraise SystemExit('MARKER: failed on purpose')\n"
        r = specs.Role("trainer", image="x", entrypoint="python", args=["-u", "-c", code])
    lines: list[str] = []
    with full_tmpfs(tmp_path / "logs") as logs:
        fill(logs)
        result = LocalStep(
            build_plan(specs.AppDef("full", roles=[r]), "local"),
            run_id=f"full-{state}",
            cfg={"log_dir": str(logs)},
            on_line=lines.append,
        ).run()
        assert (result.state, result.exit_code) == (state, 0 if state == "SUCCEEDED" else 1), result.warnings
        written = [p for p in logs.rglob("*") if p.is_file() and p.stat().st_size > 0 and p.name != ".filler"]
        assert written == []  # really full: not one byte reached the disk
    for what, path_end in (
        ("log truncated", "/trainer/0/attempt_0/rank0.log"),
        ("log truncated", "/trainer/0/agent.log"),
        ("log truncated", "/trainer/0/console.log"),
        ("result not written", "/trainer/0/result.json"),
    ):
        assert warned(result.warnings, what, path_end), (what, result.warnings)
    assert f"result not written: {result.log_dir}/result.json: {NO_SPACE}" in result.warnings
    assert any("log truncated" in line for line in lines)  # said on the console as it happened
    if state == "SUCCEEDED":
        assert any("hello from trainer rank 0 of 1" in line for line in lines)
        assert json.loads((out / "trainer-0.json").read_text())["world"] == 1
    else:
        assert result.root_cause is not None and result.root_cause.exit_code == 1
        assert result.message == "MARKER: failed on purpose"  # the tail the pipe kept


def test_the_torchstep_local_status_record_survives_a_full_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's status file (what ``torchx status`` reads) on a full state disk: the
    run goes on, the status stays complete in memory and is written whole once space returns."""
    from torchstep.local.status import ReplicaEvent
    from torchstep.schedulers import local
    from torchstep.schedulers.supervisor import StatusWriter

    with full_tmpfs(tmp_path / "state") as state:
        monkeypatch.setenv("XDG_STATE_HOME", str(state))
        writer = StatusWriter("app-1a2b3c", str(tmp_path / "logs"))
        fill(state)
        writer.update(state="PENDING")
        writer.on_status(ReplicaEvent("app-1a2b3c", "trainer", 0, "RUNNING", None, 0.0, pid=1))
        writer.update(state="SUCCEEDED", message="done")
        assert writer.lost == f"status not written: {local.status_path('app-1a2b3c')}: {NO_SPACE}"
        (state / ".filler").unlink()  # space again: the next change writes everything
        writer.update(restarts=0)
        saved = json.loads(Path(local.status_path("app-1a2b3c")).read_text())
        assert writer.lost is None
        assert saved["state"] == "SUCCEEDED" and saved["replicas"] == {"trainer/0": "RUNNING"}
