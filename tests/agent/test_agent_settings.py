"""The agent's settings without running workers (agent/settings.py, agent/settings_table.py):
the one precedence table (flag > variable > default, and where each value came from),
torchrun's and the pipeline's defaults, bad values, and that resolving creates nothing —
the runner creates the directories."""

from __future__ import annotations

import json
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from agent_testlib import WORKER, Agents
from torchstep.agent.settings import UsageError, resolve
from torchstep.agent.settings_table import DEFAULT_SIGNALS, SETTINGS, build_parser, pick, setting

# (dest, its flag, the flag's value, a variable, the variable's value, value from the flag, from the variable)
PRECEDENCE: list[tuple[str, str, str, str, str, Any, Any]] = [
    ("grace_period", "--grace-period", "3", "TORCHSTEP_GRACE_PERIOD", "7", 3.0, 7.0),
    ("heartbeat_timeout", "--heartbeat-timeout", "3", "TORCHSTEP_HEARTBEAT_TIMEOUT", "7", 3.0, 7.0),
    ("stop_timeout", "--stop-timeout", "3", "TORCHSTEP_STOP_TIMEOUT", "7", 3.0, 7.0),
    ("exit_barrier_timeout", "--exit-barrier-timeout", "3", "TORCHSTEP_EXIT_BARRIER_TIMEOUT", "7", 3.0, 7.0),
    ("watchdog_timeout", "--watchdog_timeout", "3", "TORCHSTEP_WATCHDOG_TIMEOUT", "7", 3.0, 7.0),
    ("replica_id", "--replica-id", "3", "TORCHSTEP_REPLICA_ID", "7", 3, 7),
    ("result_file", "--result-file", "/a.json", "TORCHSTEP_RESULT_FILE", "/b.json", "/a.json", "/b.json"),
    ("node_rank", "--node-rank", "1", "PET_NODE_RANK", "2", 1, 2),
    ("rdzv_endpoint", "--rdzv-endpoint", "a:1", "PET_RDZV_ENDPOINT", "b:2", "a:1", "b:2"),
    ("signals_to_handle", "--signals-to-handle", "SIGTERM", "PET_SIGNALS_TO_HANDLE", "SIGINT", "SIGTERM", "SIGINT"),
    ("role", "--role", "trainer", "PET_ROLE", "worker", "trainer", "worker"),
    ("log_dir", "--log-dir", "/flag", "TORCHSTEP_LOG_DIR", "/ours", "/flag", "/ours"),
    ("log_dir", "--log_dir", "/flag", "PET_LOG_DIR", "/pets", "/flag", "/pets"),
]


@pytest.mark.parametrize(("dest", "flag", "given", "var", "raw", "from_flag", "from_var"), PRECEDENCE)
def test_each_row_takes_the_flag_over_its_variable_over_its_default_and_says_which(
    dest: str, flag: str, given: str, var: str, raw: str, from_flag: Any, from_var: Any
) -> None:
    row, parser = setting(dest), build_parser()
    both = parser.parse_args([flag, given, "t.py"])
    assert pick(row, both, {var: raw}) == (from_flag, "flag")
    assert pick(row, parser.parse_args(["t.py"]), {var: raw}) == (from_var, f"env {var}")
    assert pick(row, parser.parse_args(["t.py"]), {}) == (row.default, row.default_source)


def test_the_table_has_one_row_per_setting_and_help_names_each_variable() -> None:
    assert len({row.dest for row in SETTINGS}) == len(SETTINGS)
    helps = {a.dest: a.help or "" for a in build_parser()._actions}
    for row in SETTINGS:
        if row.flags:
            assert f"(env {row.env}; default " in helps[row.dest]


def test_provenance_wording_of_the_special_rows() -> None:
    s = resolve(["--shutdown-timeout", "12", "t.py"], environ={"PET_LOG_DIR": "/tmp/ts-pet", "TORCHSTEP_ZYGOTE": "0"})
    assert (s.grace_period, s.sources["grace_period"]) == (12.0, "--shutdown-timeout")
    assert (s.log_dir, s.sources["log_dir"]) == ("/tmp/ts-pet", "env PET_LOG_DIR")
    assert (s.zygote, s.sources["zygote"], s.exec_reason()) == (False, "TORCHSTEP_ZYGOTE=0", "TORCHSTEP_ZYGOTE=0")
    assert (s.config.signals_to_handle, s.sources["signals_to_handle"]) == (
        DEFAULT_SIGNALS,
        "default: + SIGUSR1,SIGUSR2",
    )
    assert "role" not in s.sources and s.role == "default"  # torch's own default: no provenance line
    s = resolve(["--no-zygote", "t.py"], environ={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "4", "TORCHSTEP_ZYGOTE": "1"})
    assert (s.grace_period, s.sources["grace_period"]) == (4.0, "env TORCH_ELASTIC_SHUTDOWN_TIMEOUT")
    assert s.sources["zygote"] == "--no-zygote"
    assert "  grace_period             4s  [env TORCH_ELASTIC_SHUTDOWN_TIMEOUT]" in s.describe().splitlines()


def test_launcher_overrides_win_over_flag_and_pet_variable() -> None:
    env = {"PET_RDZV_ENDPOINT": "pet:1", "TORCHSTEP_RDZV_ENDPOINT": "10.0.0.1:29400", "TORCHSTEP_ROLE": "trainer"}
    s = resolve(["--nnodes", "2", "--rdzv-endpoint", "flag:1", "--role", "", "t.py"], environ=env)
    assert (s.config.rdzv_endpoint, s.sources["rdzv_endpoint"]) == ("10.0.0.1:29400", "env TORCHSTEP_RDZV_ENDPOINT")
    assert (s.role, s.sources["role"]) == ("trainer", "env TORCHSTEP_ROLE")
    s = resolve(["--role", "", "t.py"], environ={"PET_ROLE": "worker"})
    assert (s.role, s.sources["role"]) == ("default", "flag")  # TorchX's `--role ''`


def test_pet_variables_are_read_from_the_environment_given_not_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PET_ROLE", "from-the-process")
    assert resolve(["t.py"], environ={}).role == "default"
    s = resolve(["t.py"], environ={"PET_ROLE": "worker"})
    assert (s.role, s.sources["role"]) == ("worker", "env PET_ROLE")


def test_a_bad_variable_is_a_usage_error_naming_it() -> None:
    with pytest.raises(UsageError, match=r"^PET_NODE_RANK='x': "):
        resolve(["t.py"], environ={"PET_NODE_RANK": "x"})
    with pytest.raises(UsageError, match=r"^TORCH_ELASTIC_SHUTDOWN_TIMEOUT='soon': "):
        resolve(["t.py"], environ={"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"})
    with pytest.raises(UsageError, match=r"^TORCHSTEP_ZYGOTE='maybe': use 1 .* or 0 \(exec\)$"):
        resolve(["t.py"], environ={"TORCHSTEP_ZYGOTE": "maybe"})
    with pytest.raises(UsageError, match=r"^--stop-timeout must be >= 0, got -1.0$"):
        resolve(["t.py"], environ={"TORCHSTEP_STOP_TIMEOUT": "-1"})


def test_resolving_creates_nothing_and_the_runner_creates_the_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchstep.agent.runner import prepare_paths

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # where a new log directory goes
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torch's config_from_args sets it otherwise
    new = resolve(["--nproc-per-node", "2", "t.py"], environ={})
    logs, out = tmp_path / "logs" / "a", tmp_path / "out"
    named = resolve(["--result-file", str(out / "r.json"), "t.py"], environ={"TORCHSTEP_LOG_DIR": str(logs)})
    assert [p.name for p in tmp_path.iterdir()] == ["tmp"] and not list(tmp.iterdir())
    assert new.sources["log_dir"] == "default: new directory"
    assert Path(new.log_dir).parent == tmp and Path(new.log_dir).name.startswith("torchstep-agent-")
    prepare_paths(new)
    prepare_paths(named)
    for made in (Path(new.log_dir), logs, out):
        assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o700
    assert not (out / "r.json").exists()  # written by the run, not here


def test_an_unsafe_log_dir_is_refused_when_the_run_starts_not_when_resolving(tmp_path: Path) -> None:
    from torchstep.agent.runner import prepare_paths

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    s = resolve(["--log-dir", str(tmp_path / "link"), "t.py"], environ={})
    with pytest.raises(UsageError, match=r"^--log-dir .*symlink"):
        prepare_paths(s)


def test_an_unsafe_log_dir_exits_2_with_a_result(agents: Agents, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = tmp_path / "r.json"
    a = agents.run(
        ["--log-dir", str(tmp_path / "link"), WORKER], env={"TORCHSTEP_RESULT_FILE": str(result)}, files=False
    )
    assert a.returncode == 2 and "--log-dir " in a.stderr, a.diagnostics()
    data = json.loads(result.read_text())
    assert data["state"] == "FAILED" and data["exit_code"] == 2 and "--log-dir" in data["message"]
    assert not list((tmp_path / "real").iterdir())


def test_settings_precedence_flag_env_default() -> None:
    from torchstep.agent.settings import resolve

    env = {"TORCHSTEP_GRACE_PERIOD": "7", "TORCHSTEP_HEARTBEAT_TIMEOUT": "5", "TORCHSTEP_LOG_DIR": "/tmp/ts-env-logs"}
    s = resolve(["--grace-period", "3", "train.py", "--grace-period", "99"], environ=env)
    assert (s.grace_period, s.heartbeat_timeout, s.stop_timeout) == (3.0, 5.0, 10.0)
    assert (s.sources["grace_period"], s.sources["heartbeat_timeout"], s.sources["stop_timeout"]) == (
        "flag",
        "env TORCHSTEP_HEARTBEAT_TIMEOUT",
        "default",
    )
    assert s.entry_args[-2:] == ["--grace-period", "99"]  # the script's own flags stay its own
    assert s.log_dir == "/tmp/ts-env-logs"
    s = resolve(
        ["--log-dir", "/tmp/ts-flag-logs", "--shutdown-timeout", "12", "train.py"],
        environ=env | {"TORCHSTEP_GRACE_PERIOD": ""},
    )
    assert s.log_dir == "/tmp/ts-flag-logs" and s.grace_period == 12.0


def test_settings_pipeline_defaults_and_torchrun_compatibility() -> None:
    from torchstep.agent.settings import resolve

    single = resolve(["--nproc-per-node", "2", "train.py"], environ={})
    assert (single.config.rdzv_backend, single.config.rdzv_endpoint) == ("c10d", "localhost:0")  # like torchrun
    assert single.config.monitor_interval == 0.1 and "SIGUSR1" in single.config.signals_to_handle
    assert single.process_env == {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    multi = resolve(["--nnodes", "1:4", "--master-addr", "10.1.2.3", "train.py"], environ={})
    assert (multi.config.rdzv_backend, multi.config.rdzv_endpoint) == ("c10d", "10.1.2.3:29500")
    conf = multi.config.rdzv_configs
    assert (
        conf["join_timeout"],
        conf["read_timeout"],
        conf["last_call_timeout"],
        conf["keep_alive_interval"],
        conf["keep_alive_max_attempt"],
    ) == ("900", "900", "1", "1", "60")  # keep-alive: a 0.5 s tick (runner.fast_keep_alive) x 60 (liveness.py)
    # a classic static multi-node torchrun line stays static
    static = resolve(
        ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h", "--master-port", "1234", "t.py"], environ={}
    )
    assert static.config.rdzv_backend == "static" and static.config.rdzv_configs["rank"] == 1
    mine = resolve(["--nnodes", "2", "--rdzv-conf", "last_call_timeout=30,read_timeout=60", "t.py"], environ={})
    assert (mine.config.rdzv_configs["last_call_timeout"], mine.config.rdzv_configs["read_timeout"]) == ("30", "60")
    kept = resolve(["t.py"], environ={"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})
    assert kept.process_env == {}  # the user's explicit choice wins


def test_settings_result_files_and_bad_values() -> None:
    from torchstep.agent.settings import UsageError, resolve

    s = resolve(["--result-file", "/tmp/a.json", "t.py"], environ={"TORCHSTEP_RESULT_FILE": "/tmp/b.json"})
    assert s.result_files == ["/tmp/a.json", "/tmp/b.json"]  # the launcher still finds its copy
    with pytest.raises(UsageError, match="TORCHSTEP_HEARTBEAT_TIMEOUT"):
        resolve(["t.py"], environ={"TORCHSTEP_HEARTBEAT_TIMEOUT": "soon"})
    with pytest.raises(UsageError, match="TORCHSTEP_RDZV_CONF|rendezvous configuration"):
        resolve(["t.py"], environ={"TORCHSTEP_RDZV_CONF": "novalue"})
    with pytest.raises(UsageError, match="grace"):
        resolve(["--grace-period", "-1", "t.py"], environ={})


def test_without_omp_num_threads_the_workers_get_torchruns_1_and_no_banner(tmp_path: Path) -> None:
    """torchrun sets OMP_NUM_THREADS=1 for several workers and prints a 4-line banner saying
    so; every agent of a step printed it into the orchestrator's log. The value stays; the
    banner gives way to a row of the detailed settings, with its source."""
    import subprocess
    import sys

    from agent_testlib import SCRIPTS, clean_env

    env = clean_env()
    env.pop("OMP_NUM_THREADS")
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    agent = [sys.executable, "-m", "torchstep.agent", "--nproc-per-node", "2", "--log-dir", str(logs)]
    done = subprocess.run(
        [*agent, str(SCRIPTS / "envdump.py"), str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "OMP_NUM_THREADS" not in done.stdout + done.stderr and "*****" not in done.stderr, done.stderr
    for rank in (0, 1):
        assert json.loads((out / f"rank{rank}.json").read_text())["OMP_NUM_THREADS"] == "1"
    detailed = (logs / "agent.log").read_text()
    assert "OMP_NUM_THREADS          1  [torchrun's default with several workers]" in detailed, detailed
