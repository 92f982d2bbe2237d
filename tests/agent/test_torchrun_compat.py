"""torchstep-agent and torchrun side by side over the same scripts and flags: what a
torchrun user observes (exit status, each worker's launcher-set environment, the files,
the root-cause report) is the same. Intended differences are listed in docs/agent.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
ENVDUMP = str(SCRIPTS / "envdump.py")
#: Values that differ run to run (ports, ids, paths): compared by presence only.
VOLATILE = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "MASTER_ADDR"}


def launch(launcher: str, flags: list[str], target: list[str], out: Path, env: dict[str, str] | None = None):
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torchstep.agent" if launcher == "agent" else "torch.distributed.run"]
    import os

    full_env = {**os.environ, "PYTHONPATH": str(SCRIPTS), **(env or {})}
    done = subprocess.run([*cmd, *flags, *target], capture_output=True, text=True, timeout=180, env=full_env)
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return done, ranks


def both(tmp_path: Path, flags: list[str], target_of, env: dict[str, str] | None = None, *, together: bool = False):
    """Each launcher once over the same flags and script; ``together``: both at once, for a
    case that spends its time waiting (each picks its own free port: ``--standalone``)."""
    if together:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(2) as pool:
            futures = {
                launcher: pool.submit(launch, launcher, flags, target_of(tmp_path / launcher), tmp_path / launcher, env)
                for launcher in ("torchrun", "agent")
            }
            return {launcher: f.result() for launcher, f in futures.items()}
    runs = {}
    for launcher in ("torchrun", "agent"):
        out = tmp_path / launcher
        runs[launcher] = launch(launcher, flags, target_of(out), out, env)
    return runs


def comparable(ranks: dict[int, dict]) -> dict[int, dict]:
    return {r: {k: (v is not None) if k in VOLATILE else v for k, v in env.items()} for r, env in ranks.items()}


CASES = {
    "static 2 procs": (["--nproc-per-node", "2"], lambda out: [ENVDUMP, str(out)], None),
    "standalone": (["--standalone", "--nproc-per-node", "2"], lambda out: [ENVDUMP, str(out)], None),
    "module": (["--nproc-per-node", "2", "-m"], lambda out: ["envdump", str(out)], None),
    "no-python": (["--nproc-per-node", "1", "--no-python"], lambda out: [sys.executable, ENVDUMP, str(out)], None),
    "PET_ env": ([], lambda out: [ENVDUMP, str(out)], {"PET_NPROC_PER_NODE": "2"}),
    "elastic 1:2 standalone": (
        ["--nnodes", "1:2", "--standalone", "--nproc-per-node", "2"],
        lambda out: [ENVDUMP, str(out)],
        None,
    ),
    "max-restarts": (["--nproc-per-node", "2", "--max-restarts", "1"], lambda out: [ENVDUMP, str(out), "1"], None),
    "failure": (["--nproc-per-node", "2"], lambda out: [ENVDUMP, str(out), "1", "5"], None),
    "nproc cpu": (["--nproc-per-node", "cpu"], lambda out: [ENVDUMP, str(out)], None),
    "nproc auto": (["--nproc-per-node", "auto"], lambda out: [ENVDUMP, str(out)], None),
    "run-path": (["--nproc-per-node", "2", "--run-path"], lambda out: [str(SCRIPTS / "envfn.py"), str(out)], None),
    "rdzv-conf": (
        ["--nproc-per-node", "2", "--rdzv-conf", "join_timeout=120,timeout=120"],
        lambda out: [ENVDUMP, str(out)],
        None,
    ),
    "max-restarts spent": (
        ["--nproc-per-node", "2", "--max-restarts", "2"],
        lambda out: [ENVDUMP, str(out), "0", "7"],
        None,
    ),
}


#: Cases that only wait (an elastic standalone group of one waits out the rendezvous's
#: last call, 30 s, idle): both launchers run at once.
WAITING = {"elastic 1:2 standalone"}
#: The case whose command line is the plain console's (``--nproc-per-node 2``, no console
#: flag): its console is compared too, as test_the_console_looks_like_torchruns would.
PLAIN_CONSOLE = "static 2 procs"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", sorted(CASES))
def test_same_exit_status_and_worker_environment(tmp_path: Path, case: str) -> None:
    flags, target_of, env = CASES[case]
    runs = both(tmp_path, flags, target_of, env, together=case in WAITING)
    (t_done, t_ranks), (a_done, a_ranks) = runs["torchrun"], runs["agent"]
    if case == PLAIN_CONSOLE:
        assert_same_console(t_done, a_done)
    assert (t_done.returncode == 0) == (a_done.returncode == 0), (t_done.stderr[-1500:], a_done.stderr[-1500:])
    assert sorted(t_ranks) == sorted(a_ranks)
    assert comparable(a_ranks) == comparable(t_ranks)
    if t_done.returncode:
        import re

        for done in (t_done, a_done):  # the root-cause report a torchrun user greps for
            assert "ChildFailedError" in done.stderr and "Root Cause (first observed failure)" in done.stderr
        # the first observed failure's rank; the table's other entries depend on timing (torch
        # lists a rank still running at the failure as SIGTERM'd, one already done not at all)
        root = re.compile(
            r"Root Cause \(first observed failure\):\n\[\d+\]:\n.*?(rank +: \d+ \(local_rank: \d+\))", re.S
        )
        assert root.findall(a_done.stderr) == root.findall(t_done.stderr) != []


def worker_lines(text: str) -> list[str]:
    """What the workers printed, with its prefix (not the launchers' own log records).
    Matched as tokens, not lines: under torchrun two workers' writes to the shared console
    can land inside one line ("err rank 1err rank 0")."""
    import re

    return sorted(re.findall(r"(?:\[[^\]\s]*\]:)?(?:out|err) rank \d+", text))


def assert_same_console(t_done: subprocess.CompletedProcess, a_done: subprocess.CompletedProcess) -> None:
    """The workers' lines on the same streams with the same prefixes, and one settings line."""
    assert worker_lines(a_done.stdout) == worker_lines(t_done.stdout)  # same lines, same prefixes, same stream
    assert worker_lines(a_done.stderr) == worker_lines(t_done.stderr)
    settings = [x for x in a_done.stderr.splitlines() if "torchstep-agent" in x and "effective settings" in x]
    assert len(settings) == 1  # one line of our own settings, like torchrun's quiet start


@pytest.mark.timeout(600)
@pytest.mark.parametrize("flags", [["--tee", "3"], ["--tee", "1"], ["--local-ranks-filter", "1"]])
def test_the_console_looks_like_torchruns(tmp_path: Path, flags: list[str]) -> None:
    """Each console flag. Compared where the same command line already runs: the plain
    console (no flag) in the "static 2 procs" case of test_same_exit_status_and_worker_environment,
    ``--redirects 3`` in test_log_dir_has_torchruns_layout (with ``--log-dir``)."""
    runs = both(tmp_path, ["--nproc-per-node", "2", *flags], lambda out: [ENVDUMP, str(out)])
    assert_same_console(runs["torchrun"][0], runs["agent"][0])


@pytest.mark.timeout(600)
def test_logs_specs_loads_a_torchrun_entry_point_as_torchrun_does(tmp_path: Path) -> None:
    """``--logs-specs NAME`` loads ``torchrun.logs_specs[NAME]`` and lets it place the files."""
    import os

    site = tmp_path / "site"
    (site / "mylogs-1.0.dist-info").mkdir(parents=True)
    (site / "mylogs-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: mylogs\nVersion: 1.0\n")
    (site / "mylogs-1.0.dist-info" / "entry_points.txt").write_text("[torchrun.logs_specs]\nmine = mylogs:Mine\n")
    (site / "mylogs.py").write_text(
        "import os\n"
        "from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs\n"
        "class Mine(DefaultLogsSpecs):\n"
        "    def reify(self, envs):\n"
        "        dest = super().reify(envs)\n"
        "        for lr in list(dest.stdouts):\n"
        "            if dest.stdouts[lr]:\n"
        "                dest.stdouts[lr] = dest.stdouts[lr].replace('stdout.log', 'mine-out.log')\n"
        "        return dest\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(SCRIPTS)])}
    found = {}
    for launcher in ("torchrun", "agent"):
        logs, out = tmp_path / f"{launcher}-logs", tmp_path / launcher
        done, ranks = launch(
            launcher,
            ["--logs-specs", "mine", "--redirects", "3", "--nproc-per-node", "2", "--log-dir", str(logs)],
            [ENVDUMP, str(out)],
            out,
            env,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        found[launcher] = sorted(p.name for p in logs.rglob("mine-out.log"))
        assert len(ranks) == 2
    assert found["agent"] == found["torchrun"] == ["mine-out.log", "mine-out.log"]

    done, _ = launch("agent", ["--logs-specs", "nope", "--nproc-per-node", "1"], [ENVDUMP, str(tmp_path)], tmp_path)
    assert done.returncode == 1 and "nope" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "flags",
    [["--no-python", "--module"], ["--nproc-per-node=unknown"], ["--logs-specs", "nosuch"], ["--nnodes", "x:y"]],
    ids=["no-python-with-module", "nproc-unknown", "unknown-logs-specs", "bad-nnodes"],
)
def test_a_flag_combination_torchrun_refuses_ends_as_torchrun_ends(tmp_path: Path, flags: list[str]) -> None:
    """The exception line torchrun ends with (``ValueError: ...``) is the agent's last line
    too, with torchrun's exit status: scripts and tests written for torchrun see the same."""
    runs = both(tmp_path, flags, lambda out: [ENVDUMP, str(out)])
    (t_done, t_ranks), (a_done, a_ranks) = runs["torchrun"], runs["agent"]
    t_last, a_last = (done.stderr.strip().splitlines()[-1] for done in (t_done, a_done))
    assert t_last.startswith("ValueError: ") and a_last == t_last, (t_done.stderr[-800:], a_done.stderr[-800:])
    assert a_done.returncode == t_done.returncode == 1
    assert t_ranks == a_ranks == {}  # no worker started
    assert "Traceback" not in a_done.stderr


@pytest.mark.timeout(600)
def test_sigterm_stops_both_alike(tmp_path: Path) -> None:
    """SIGTERM to the launcher: the workers get it, the launcher exits non-zero, nothing is left."""
    import os
    import signal
    import time

    from proclib import wait_for

    codes = {}
    for launcher in ("torchrun", "agent"):
        out = tmp_path / launcher
        out.mkdir()
        cmd = [sys.executable, "-m", "torchstep.agent" if launcher == "agent" else "torch.distributed.run"]
        proc = subprocess.Popen(
            [*cmd, "--nproc-per-node", "2", ENVDUMP, str(out), "", "0", "--sleep"],
            env={**os.environ, "PYTHONPATH": str(SCRIPTS)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_for(lambda out=out: len(list(out.glob("rank*.json"))) == 2, 120, "both workers")
            time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            codes[launcher] = proc.wait(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    assert codes["torchrun"] != 0 and codes["agent"] != 0
    assert codes["agent"] == 143  # ours names the signal (a superset of torchrun's "non-zero")


@pytest.mark.timeout(600)
def test_log_dir_has_torchruns_layout(tmp_path: Path) -> None:
    """``--log-dir`` (with ``--redirects 3``, where torchrun writes files):
    ``<log_dir>/<run_id>_<random>/attempt_0/<local_rank>/{stdout,stderr}.log`` on both; the
    agent adds only its own ``agent.log`` and ``result.json`` at the top; the consoles match."""
    layouts = {}
    runs = {}
    for launcher in ("torchrun", "agent"):
        logs = tmp_path / f"{launcher}-logs"
        out = tmp_path / launcher
        done, _ = launch(
            launcher, ["--nproc-per-node", "2", "--redirects", "3", "--log-dir", str(logs)], [ENVDUMP, str(out)], out
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs[launcher] = done
        (run_dir,) = [p for p in logs.iterdir() if p.is_dir()]
        layouts[launcher] = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*.log"))
        assert "err rank 1" in (run_dir / "attempt_0" / "1" / "stderr.log").read_text()
    assert (
        layouts["agent"]
        == layouts["torchrun"]
        == ["attempt_0/0/stderr.log", "attempt_0/0/stdout.log", "attempt_0/1/stderr.log", "attempt_0/1/stdout.log"]
    )
    assert sorted(p.name for p in (tmp_path / "agent-logs").iterdir() if p.is_file()) == ["agent.log", "result.json"]
    assert_same_console(runs["torchrun"], runs["agent"])
