"""The local target as an attacker and a fault injector would drive it (issue: hardening).

Shell metacharacters in every string field never execute; files and directories torchstep
creates are private; user mistakes are one clear SpecError, not a traceback.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torchstep
from local_testlib import role
from torchx import specs

#: Host directory names an attacker would choose (each must reach the worker verbatim).
NASTY = [
    "x;touch PWNED;x",
    "$(touch PWNED)",
    "`touch PWNED`",
    "q'uo\"te",
    "new\nline",
    "sp ace",
    "-rf",
    "{{ ti.xcom_pull() }}",
]


def pwned(*dirs: Path) -> list[Path]:
    return [d / "PWNED" for d in dirs if (d / "PWNED").exists()]


@pytest.mark.parametrize("name", NASTY)
def test_a_mount_source_reaches_an_argv_worker_verbatim_and_never_runs(
    tmp_path: Path, log_dir: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    src = tmp_path / name
    src.mkdir()
    (src / "f.txt").write_text("payload")
    out = tmp_path / "out"
    out.mkdir()
    r = role(
        "trainer",
        ["report", str(out), "--data=/data/f.txt", name],
        mounts=[specs.BindMount(src_path=str(src), dst_path="/data")],
        env={"EVIL": name, "DATA_DIR": "/data"},
    )
    result = torchstep.run_local(specs.AppDef("nasty", roles=[r]), log_dir=str(log_dir))
    assert result.state == "SUCCEEDED", result.message
    info = json.loads((out / "trainer-0.json").read_text())
    assert info["data"] == "payload"  # the rewritten path, verbatim
    assert info["data_env"] == str(src)  # env values are rewritten verbatim too
    assert info["args"][-1] == name  # an argument is never re-parsed
    assert pwned(tmp_path, src, Path.cwd()) == []


@pytest.mark.parametrize("name", [n for n in NASTY if n not in ("-rf",)])
@pytest.mark.parametrize("entrypoint", ["bash", "sh", "/bin/bash", "python3"])
def test_a_mount_source_with_shell_characters_is_refused_inside_interpreted_code(
    tmp_path: Path, log_dir: Path, name: str, entrypoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    src = tmp_path / name
    src.mkdir()
    code = "cat /data/f.txt" if "python" not in entrypoint else "print(open('/data/f.txt').read())"
    r = specs.Role(
        "trainer",
        image="x",
        entrypoint=entrypoint,
        args=["-c", code],
        mounts=[specs.BindMount(src_path=str(src), dst_path="/data")],
    )
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(specs.AppDef("nasty", roles=[r]), log_dir=str(log_dir))
    assert err.value.field == "roles[0].mounts[0].src_path"
    assert "src_path == dst_path" in str(err.value)
    assert pwned(tmp_path, src) == []
    assert not log_dir.exists() or not any(log_dir.iterdir())  # nothing started


def test_a_plain_mount_source_is_still_rewritten_inside_a_shell_script(tmp_path: Path, log_dir: Path) -> None:
    src = tmp_path / "plain-dir_1.0"
    src.mkdir()
    (src / "f.txt").write_text("ok")
    marker = tmp_path / "copied.txt"
    r = specs.Role(
        "trainer",
        image="x",
        entrypoint="bash",
        args=["-c", f"cp /data/f.txt {marker}"],
        mounts=[specs.BindMount(src_path=str(src), dst_path="/data")],
    )
    result = torchstep.run_local(specs.AppDef("plain", roles=[r]), log_dir=str(log_dir))
    assert result.state == "SUCCEEDED", result.message
    assert marker.read_text() == "ok"


@pytest.mark.parametrize("value", ["$(touch PWNED)", "a;touch PWNED", "`touch PWNED`", "{{ ds }}", "-rf"])
def test_env_values_and_args_with_shell_characters_reach_the_worker_verbatim(
    tmp_path: Path, log_dir: Path, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    r = role("trainer", ["report", str(out), value], env={"DATA_DIR": value})
    result = torchstep.run_local(specs.AppDef("meta", roles=[r]), log_dir=str(log_dir))
    assert result.state == "SUCCEEDED", result.message
    info = json.loads((out / "trainer-0.json").read_text())
    assert info["args"][-1] == value and info["data_env"] == value
    assert pwned(tmp_path, Path.cwd()) == []


@pytest.mark.parametrize("name", ["-rf", "a;b", "$(x)", "a b", "a`b`"])
def test_role_names_that_break_a_command_line_are_refused(name: str) -> None:
    r = specs.Role(name, image="x", entrypoint="true")
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.build_plan(specs.AppDef("app", roles=[r]), "local")
    assert err.value.field == "roles[0].name"


def test_run_directories_and_logs_are_private(tmp_path: Path, log_dir: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = torchstep.run_local(
        specs.AppDef("priv", roles=[role("trainer", ["report", str(out)], nproc=2)]), log_dir=str(log_dir)
    )
    assert result.state == "SUCCEEDED", result.message
    run_dir = log_dir / result.app_id
    for path in [run_dir, *run_dir.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        if path.is_dir():
            assert mode == 0o700, f"{path} is {oct(mode)}"
        else:
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"


def test_a_log_dir_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "logs"
    link.symlink_to(target)
    r = specs.Role("trainer", image="x", entrypoint="true")
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(specs.AppDef("app", roles=[r]), log_dir=str(link))
    assert "symlink" in str(err.value)
    assert list(target.iterdir()) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory owned by someone else")
def test_a_log_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o777)
    os.chown(foreign, 65534, 65534)
    r = specs.Role("trainer", image="x", entrypoint="true")
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(specs.AppDef("app", roles=[r]), log_dir=str(foreign))
    assert "owned by" in str(err.value)


@pytest.mark.parametrize("make", ["file", "unwritable"])
def test_an_unusable_log_dir_is_a_spec_error_not_a_traceback(tmp_path: Path, make: str) -> None:
    bad = tmp_path / "bad"
    if make == "file":
        bad.write_text("not a directory")
        log_dir = str(bad / "logs")
    else:
        bad.mkdir(mode=0o500)
        log_dir = str(bad / "logs")
        if os.geteuid() == 0:
            pytest.skip("root writes anywhere")
    r = specs.Role("trainer", image="x", entrypoint="true")
    with pytest.raises(torchstep.SpecError) as err:
        torchstep.run_local(specs.AppDef("app", roles=[r]), log_dir=log_dir)
    assert err.value.field == "log_dir"


def test_the_default_log_root_is_per_user_and_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchstep.local.options import default_log_dir

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = Path(default_log_dir())
    assert root == tmp_path / "state" / "torchstep"
    r = specs.Role("trainer", image="x", entrypoint="true")
    result = torchstep.run_local(specs.AppDef("app", roles=[r]))
    assert result.state == "SUCCEEDED"
    assert Path(result.log_dir or "").parent == root
    for d in (root, root / result.app_id):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e12", float("inf")])
def test_absurd_timeouts_are_spec_errors(value: object) -> None:
    from torchstep.local.options import resolve

    with pytest.raises(torchstep.SpecError) as err:
        resolve({"timeout": value})
    assert err.value.field == "cfg['timeout']"


BAD_APPS = {
    "roles[0].mounts[0]": {"mounts": ["type=bind,src=/x"]},
    "roles[0].mounts[0].type": {"mounts": [{"type": "nfs", "src_path": "/x", "dst_path": "/y"}]},
    "roles[0].mounts": {"mounts": "type=bind,src=/x,dst=/y"},
    "roles[0].retry_policy": {"retry_policy": "SOMETIMES"},
    "roles[0].args": {"args": "ls -l"},
    "roles[0].resource.cpu": {"resource": {"cpu": "lots"}},
}


@pytest.mark.parametrize("field", sorted(BAD_APPS))
def test_a_bad_app_json_is_one_line_naming_the_field(tmp_path: Path, field: str) -> None:
    import subprocess
    import sys

    role_data = {"name": "r", "image": "x", "entrypoint": "true", **BAD_APPS[field]}
    path = tmp_path / "app.json"
    path.write_text(json.dumps({"name": "a", "roles": [role_data]}))
    done = subprocess.run(
        [sys.executable, "-m", "torchstep.cli", "run", "--app", str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "fix:" in lines[0], done.stderr


def test_ctrl_c_while_a_component_function_runs_is_interrupted_exit_130(tmp_path: Path) -> None:
    import signal
    import subprocess
    import sys

    from proclib import wait_for

    marker = tmp_path / "entered"
    comp = tmp_path / "slowcomp.py"
    comp.write_text(
        "import pathlib, time\n"
        "from torchx import specs\n"
        "def slow() -> specs.AppDef:\n"
        f"    pathlib.Path({str(marker)!r}).write_text('x')\n"
        "    time.sleep(60)\n"
        "    return specs.AppDef('never', roles=[])\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchstep.cli", "run", f"{comp}:slow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        wait_for(marker.exists, 60, "the component function to start")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.timeout(300)
def test_a_second_run_with_the_same_run_id_is_refused_while_the_first_runs(log_dir: Path) -> None:
    import threading

    from proclib import wait_for

    app = specs.AppDef("same", roles=[role("trainer", ["loop", "100000", "0.05"])])
    cancel = threading.Event()
    box: dict[str, torchstep.StepResult] = {}
    first = threading.Thread(
        target=lambda: box.update(
            r=torchstep.run_local(app, log_dir=str(log_dir), cfg={"run_id": "r1", "grace_period": 5}, cancel=cancel)
        )
    )
    first.start()
    try:
        wait_for(lambda: list(log_dir.glob("*/trainer/0/attempt_*/rank0.log")), 120, "the first run to start")
        with pytest.raises(torchstep.SpecError) as err:
            torchstep.run_local(app, log_dir=str(log_dir), cfg={"run_id": "r1"})
        assert err.value.field == "cfg['run_id']"
    finally:
        cancel.set()
        first.join(60)
    assert box["r"].state == "CANCELLED"
    again = torchstep.run_local(
        specs.AppDef("same", roles=[specs.Role("trainer", image="x", entrypoint="true")]),
        log_dir=str(log_dir),
        cfg={"run_id": "r1"},
    )
    assert again.state == "SUCCEEDED"  # the lock is released when a run ends


@pytest.mark.parametrize("where", ["result", "log"])
def test_the_agent_refuses_an_unwritable_result_file_or_log_dir_before_starting(tmp_path: Path, where: str) -> None:
    import subprocess
    import sys

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    flag = ["--result-file", str(a_file / "result.json")] if where == "result" else ["--log-dir", str(a_file)]
    started = tmp_path / "started"
    done = subprocess.run(
        [sys.executable, "-m", "torchstep.agent", *flag, "--nproc-per-node", "1", "--no-python", "touch", str(started)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert ("--result-file" if where == "result" else "--log-dir") in done.stderr and "fix:" in done.stderr
    assert "Traceback" not in done.stderr
    assert not started.exists()  # refused before any worker ran


@pytest.mark.timeout(300)
def test_a_rank_that_writes_20_mib_and_dies_loses_no_line(log_dir: Path) -> None:
    import re

    from torchstep.plan.planner import build_plan
    from torchstep.steps import LocalStep

    n = 300_000  # 72-byte lines: 21.6 MB, written as fast as Python can
    code = (
        "import sys\n"
        f"for i in range({n}):\n"
        "    sys.stdout.write(f'line {i:07d} ' + 'x' * 56 + '\\n')\n"
        "raise ValueError('MARKER-boom at the end')\n"
    )
    r = specs.Role("w", image="x", entrypoint="python", args=["-u", "-c", code])
    lines: list[str] = []
    result = LocalStep(
        build_plan(specs.AppDef("big", roles=[r]), "local"),
        run_id="big",
        cfg={"log_dir": str(log_dir)},
        on_line=lines.append,
    ).run()
    assert result.state == "FAILED" and result.exit_code == 1
    numbered = re.compile(r"line (\d{7}) x{56}$")
    seen = [int(m.group(1)) for line in lines if (m := numbered.search(line))]
    assert seen == list(range(n))  # every line, in order, none twice
    tail = "\n".join(lines[-40:])
    assert "Traceback (most recent call last)" in tail and "ValueError: MARKER-boom at the end" in tail
    (rank_log,) = list((log_dir / result.app_id).glob("w/0/attempt_*/rank0.log"))
    text = rank_log.read_text()
    assert sum(1 for line in text.splitlines() if numbered.fullmatch(line)) == n
    assert "ValueError: MARKER-boom at the end" in text


@pytest.mark.timeout(300)
def test_a_killed_agent_leaves_a_final_replica_result_and_no_temporary_directory(
    log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    # this run's own temporary directory (the supervisor's and every agent's): what other
    # torchstep runs on the machine leave in the shared one is not this run's leftover
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    code = "import os, signal, time\ntime.sleep(1)\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(60)\n"
    r = specs.Role("w", image="x", entrypoint="python", args=["-c", code])
    result = torchstep.run_local(specs.AppDef("killed", roles=[r]), log_dir=str(log_dir))
    assert result.state == "FAILED"
    (replica_file,) = list((log_dir / result.app_id).glob("w/0/result.json"))
    saved = json.loads(replica_file.read_text())
    assert saved["state"] == "FAILED" and saved["replicas"][0]["state"] == "FAILED"
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith("torchstep-")) == []


@pytest.mark.timeout(300)
def test_a_full_disk_under_the_console_log_truncates_it_and_the_run_still_ends_right(
    log_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC on every write of the supervisor's console.log (the file is /dev/full): the
    console keeps every line, the run ends with its real outcome, the result says so."""
    import torchstep.local.supervisor as supervisor
    from torchstep.plan.planner import build_plan
    from torchstep.steps import LocalStep

    real_open = supervisor.open_private

    def full_disk(path: str, flags: int = os.O_WRONLY) -> int:
        if str(path).endswith("console.log"):
            return os.open("/dev/full", os.O_WRONLY)
        return real_open(path, flags)

    monkeypatch.setattr(supervisor, "open_private", full_disk)
    out = tmp_path / "out"
    out.mkdir()
    cases = {
        "SUCCEEDED": role("trainer", ["report", str(out)]),
        "FAILED": role("trainer", ["attempts", str(tmp_path / "counter"), "9", "3"]),
    }
    for state, r in cases.items():
        lines: list[str] = []
        app = specs.AppDef("full", roles=[r])
        result = LocalStep(
            build_plan(app, "local"), run_id=f"full-{state}", cfg={"log_dir": str(log_dir)}, on_line=lines.append
        ).run()
        assert result.state == state
        assert any("log truncated" in w and "No space left on device" in w for w in result.warnings), result.warnings
        assert any("log truncated" in line for line in lines)
        saved = json.loads((log_dir / result.app_id / "result.json").read_text())
        assert saved["warnings"] == result.warnings
        if state == "SUCCEEDED":
            assert any("hello from trainer rank 0 of 1" in line for line in lines)  # the console kept the lines
