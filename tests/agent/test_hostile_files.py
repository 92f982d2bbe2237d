"""A worker that plays the stranger with the files the agent reads and the bytes it prints
(issue 33, items 3 to 5), against a real agent: a FIFO or a symlink where its outputs or
error file go, outputs nested 985 or 10^5 levels deep, a NaN output, terminal escapes, and
one 200 MB line without a newline. The agent never blocks, keeps the real exit code and
root cause, says in the result's warnings what it refused, escapes what leaves the rank's
log, and keeps the result small; the rank's own log keeps every byte as written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from agent_testlib import Agents
from torchstep.untrusted import MAX_JSON_DEPTH, MAX_TAIL_LINE_BYTES

RAW = ("\x1b[2J", "\x1b]0;owned\x07", "\x1b]8;;https://evil.example\x1b\\", "\x07", "\x00")
HOSTILE = "start \x1b[2J title \x1b]0;owned\x07 link \x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\ nul \x00 end"


def script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text("import os, sys\n" + body)
    return str(path)


def run(agents: Agents, tmp_path: Path, name: str, body: str, timeout: float = 180):
    return agents.run(["--nproc-per-node", "1", script(tmp_path, name, body)], name=name, timeout=timeout)


@pytest.mark.timeout(300)
def test_a_fifo_as_the_outputs_file_never_blocks_the_agent(agents: Agents, tmp_path: Path) -> None:
    a = run(agents, tmp_path, "fifo_outputs", "os.mkfifo(os.environ['TORCHSTEP_OUTPUT_FILE'])\n")
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert r["state"] == "SUCCEEDED" and r["outputs"] == {}
    assert any("rank 0's outputs file" in w and "refused: not a regular file" in w for w in r["warnings"]), r


@pytest.mark.timeout(300)
def test_a_fifo_as_the_error_file_keeps_the_real_exit_code_and_root_cause(agents: Agents, tmp_path: Path) -> None:
    body = "os.mkfifo(os.environ['TORCHELASTIC_ERROR_FILE'])\nprint('ValueError: the real cause', flush=True)\nsys.exit(3)\n"
    a = run(agents, tmp_path, "fifo_error", body)
    assert a.returncode == 3, a.diagnostics()
    r = a.result
    assert r["state"] == "FAILED" and r["exit_code"] == 3
    assert r["root_cause"]["exit_code"] == 3 and r["root_cause"]["tail"][-1] == "ValueError: the real cause"
    assert any("error file" in w and "refused: not a regular file" in w for w in r["warnings"]), r


@pytest.mark.timeout(300)
def test_a_symlink_as_the_outputs_file_is_refused_never_followed(agents: Agents, tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "s3cr3t"}')
    a = run(agents, tmp_path, "link_outputs", f"os.symlink({str(secret)!r}, os.environ['TORCHSTEP_OUTPUT_FILE'])\n")
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert r["outputs"] == {} and "s3cr3t" not in json.dumps(r)
    assert any("refused: is a symlink" in w for w in r["warnings"]), r


@pytest.mark.timeout(300)
@pytest.mark.parametrize("depth", [985, 10**5])
def test_deeply_nested_outputs_are_refused_with_a_warning_not_lost_silently(
    agents: Agents, tmp_path: Path, depth: int
) -> None:
    body = f"open(os.environ['TORCHSTEP_OUTPUT_FILE'], 'w').write('[' * {depth} + ']' * {depth})\n"
    a = run(agents, tmp_path, f"deep{depth}", body)
    assert a.returncode == 0, a.diagnostics()
    r = a.result
    assert r["state"] == "SUCCEEDED" and r["outputs"] == {}
    assert any(f"nested deeper than {MAX_JSON_DEPTH} levels" in w for w in r["warnings"]), r
    assert "building the full result failed" not in a.stderr


@pytest.mark.timeout(300)
def test_a_nan_output_is_published_as_the_string_nan_with_a_warning(agents: Agents, tmp_path: Path) -> None:
    body = "import torchstep\ntorchstep.output('acc', float('nan'))\ntorchstep.output('loss', 0.25)\n"
    a = run(agents, tmp_path, "nan", body)
    assert a.returncode == 0, a.diagnostics()
    text = a.result_file.read_text()
    data = json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in result.json"))
    assert data["outputs"] == {"acc": "NaN", "loss": 0.25}
    assert any('acc: NaN is not a JSON number; kept as the string "NaN"' in w for w in data["warnings"]), data


@pytest.mark.timeout(300)
def test_terminal_escapes_are_shown_never_obeyed_past_the_ranks_log(agents: Agents, tmp_path: Path) -> None:
    body = f"print({HOSTILE!r}, flush=True)\nraise ValueError({HOSTILE!r})\n"
    a = run(agents, tmp_path, "escapes", body)
    assert a.returncode == 1, a.diagnostics()
    console = a.stdout + a.stderr
    for raw in RAW:
        assert raw not in console, f"{raw!r} reached the console"
    assert "start \\x1b[2J title \\x1b]0;owned\\x07" in console
    logs = [p for p in a.log_dir.rglob("*.log") if p.name != "agent.log"]
    assert any(HOSTILE.encode() in p.read_bytes() for p in logs), logs  # the rank's own log: as written
    rc = a.result["root_cause"]
    text = json.dumps(rc)
    assert "\\u001b" not in text and "\\u0007" not in text and "\\u0000" not in text, rc
    last = [line for line in a.stderr.splitlines() if line.startswith("[torchstep-agent ")][-1]
    assert "ValueError: start \\x1b[2J title" in last, last


@pytest.mark.timeout(420)
def test_one_200_mb_line_keeps_the_result_small_and_the_log_whole(agents: Agents, tmp_path: Path) -> None:
    body = (
        "chunk = 'x' * (1 << 20)\nfor _ in range(200):\n    sys.stdout.write(chunk)\nsys.stdout.flush()\nsys.exit(1)\n"
    )
    a = run(agents, tmp_path, "bigline", body, timeout=360)
    assert a.returncode == 1, a.diagnostics()
    size = a.result_file.stat().st_size
    assert size < 512 * 1024, size  # was 239 MB: 50 tail pieces of 4 MiB, stored twice
    r = a.result
    assert r["exit_code"] == 1 and r["root_cause"]["exit_code"] == 1
    tail = r["root_cause"]["tail"]
    assert tail and all(len(line.encode()) <= MAX_TAIL_LINE_BYTES + 64 for line in tail), [len(x) for x in tail]
    assert tail[-1].startswith("x" * 100) and tail[-1].endswith(f"[line cut at {MAX_TAIL_LINE_BYTES} bytes]"), tail[-1][
        -80:
    ]
    assert len(tail) == 1, len(tail)  # one line, however many pieces the tee read it in
    logs = [p for p in a.log_dir.rglob("*.log") if p.name != "agent.log"]
    assert max(p.stat().st_size for p in logs) >= 200 << 20  # every byte in the rank's log
    assert (a.out / "stdout").stat().st_size >= 200 << 20  # and on the console


def test_reading_a_tail_from_a_fifo_or_a_symlink_returns_nothing_without_blocking(tmp_path: Path) -> None:
    """The tail of a rank without a tee (a ``--logs-specs`` of the user's) is read back
    from its log file, which the worker owns."""
    import threading

    from torchstep.agent.logs import tail_lines

    fifo = tmp_path / "stdout.log"
    os.mkfifo(fifo)
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t\n")
    (tmp_path / "link.log").symlink_to(secret)
    got: list[list[str]] = []
    t = threading.Thread(target=lambda: got.append(tail_lines(str(fifo), 5)), daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let the reader go before failing
        pytest.fail("tail_lines blocked on a FIFO")
    assert got == [[]]
    assert tail_lines(str(tmp_path / "link.log"), 5) == []
