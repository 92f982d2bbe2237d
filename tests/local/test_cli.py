"""``torchstep run``: APPLICATION retries owned by the CLI, SIGTERM, TorchX builtins, the
live table on a terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
from pathlib import Path

import pytest
from local_testlib import WORKER, cli, rank_log_has, role
from proclib import wait_for
from torchstep.local.appfile import app_to_dict
from torchx import specs


def write_app(path: Path, app: specs.AppDef) -> str:
    path.write_text(json.dumps(app_to_dict(app)))
    return str(path)


def result_of(stdout: str) -> dict:
    """The JSON printed by --json (after the plain status lines)."""
    return json.loads(stdout[stdout.index("\n{\n") + 1 :])


@pytest.mark.parametrize(
    ("fail_until", "code", "rc", "attempts"),
    [
        (2, 1, 0, 2),  # fails once, retried, SUCCEEDED
        (99, 3, 3, 3),  # retries: 2 -> at most 3 attempts in total
        (99, 82, 82, 1),  # non-retryable: no retry at all
    ],
    ids=["fails-once", "always-fails", "non-retryable"],
)
def test_application_retries(tmp_path: Path, log_dir: Path, fail_until: int, code: int, rc: int, attempts: int) -> None:
    counter = tmp_path / "attempts.txt"
    app = specs.AppDef(
        "flaky",
        roles=[role("main", ["attempts", str(counter), str(fail_until), str(code)], max_retries=2)],
    )
    p = subprocess.run(
        cli("--app", write_app(tmp_path / "app.json", app), "--log-dir", str(log_dir), "-c", "retry_delay=0", "--json"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == rc, p.stdout + p.stderr
    result = result_of(p.stdout)
    assert result["attempts"] == attempts
    assert len(counter.read_text().splitlines()) == attempts  # the app really ran that often
    assert result["state"] == ("SUCCEEDED" if rc == 0 else "FAILED")
    assert result["retryable"] is (rc != 0 and code != 82)  # a SUCCEEDED run is never retryable


def test_the_summary_names_the_root_cause_by_its_last_meaningful_line(tmp_path: Path, log_dir: Path) -> None:
    """A missing script: python's "can't open file", not "exited with code 2" (issue 23, item 8)."""
    missing = tmp_path / "missing.py"
    # behind a shell line: `torchstep run` checks a script it can see before starting (test_first_hour)
    role = specs.Role("trainer", image="x", entrypoint="sh", args=["-c", f"exec python {missing}"])
    app = specs.AppDef("missing", roles=[role])
    p = subprocess.run(
        cli("--app", write_app(tmp_path / "app.json", app), "--log-dir", str(log_dir)),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    at = next(
        i for i, line in enumerate(lines) if line.strip().startswith("root cause: rank 0 (trainer replica 0) exit 2")
    )
    assert f"can't open file '{missing}'" in lines[at + 1], p.stdout
    assert "exited with code 2" not in p.stdout


def test_sigterm_stops_every_process(tmp_path: Path, log_dir: Path) -> None:
    app = specs.AppDef("long", roles=[role("trainer", ["loop", "600", "0.1"], replicas=2)])
    proc = subprocess.Popen(
        cli(
            "--app", write_app(tmp_path / "app.json", app), "--log-dir", str(log_dir), "-c", "grace_period=5,tee=false"
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: rank_log_has(log_dir, "trainer", 1, "step 2"), 120, "the workers to train")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, out
    (saved,) = log_dir.glob("*/result.json")
    result = json.loads(saved.read_text())
    assert result["state"] == "CANCELLED" and result["retryable"] is False
    # no descendant left: checked by the no_leftovers fixture (every process carries the token)


@pytest.mark.slow
def test_torchx_builtins_through_the_cli(tmp_path: Path, log_dir: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    ddp = [
        "dist.ddp",
        "--log-dir",
        str(log_dir),
        "--json",
        "--",
        "-j",
        "2x2",
        "--script",
        WORKER,
        "--",
        "report",
        str(out),
    ]
    p = subprocess.run(cli(*ddp), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert len(result_of(p.stdout)["replicas"]) == 2 and len(list(out.glob("*.json"))) == 4
    assert "[worker/3]" in p.stdout  # dist.ddp names the role after the script; every rank prefixed

    marker = tmp_path / "sh.txt"
    p = subprocess.run(
        cli("utils.sh", "--log-dir", str(log_dir), "--", "touch", str(marker)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and marker.exists(), p.stdout + p.stderr
    assert "torchstep: sh replica 0 SUCCEEDED" in p.stdout  # plain status lines when stdout is not a terminal


def test_live_table_on_a_terminal(log_dir: Path) -> None:
    """utils.python under a pseudo-terminal: the rich table replaces the plain lines."""
    main, sub = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen(
        cli("utils.python", "--log-dir", str(log_dir), "--", "-c", "print('py-ok')"),
        stdin=sub,
        stdout=sub,
        stderr=sub,
        env=env,
        close_fds=True,
    )
    os.close(sub)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([main], [], [], 120)
            if not ready:
                break
            try:
                data = os.read(main, 65536)
            except OSError:  # EIO: the terminal's last writer is gone
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(main)
        proc.wait(60)
    text = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 0, text
    assert "py-ok" in text and "SUCCEEDED" in text
    assert "┃" in text or "│" in text  # a rich table, not "torchstep: python replica 0 SUCCEEDED" lines
    assert "torchstep: python replica 0 RUNNING" not in text
