"""Files and text a worker controls, read and published as a stranger wrote them (issue 33,
items 3 to 5): the one reader (:func:`torchstep.untrusted.read_capped`) never follows a
symlink, never blocks on a FIFO and caps sizes; the one parser never raises; a result file
read back (:meth:`StepResult.load`, the local supervisor's) refuses with a ``ValueError``
that says why; non-finite numbers become strings with a warning; a result never outgrows
its cap; control characters are escaped where a line leaves the rank's log.

The agent end to end: tests/agent/test_hostile_files.py; Kubernetes termination messages:
tests/kubernetes/test_hostile_termination.py."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torchstep import untrusted
from torchstep.result import RankResult, ReplicaResult, StepResult, root_cause_line
from torchstep.untrusted import (
    MAX_JSON_DEPTH,
    MAX_RESULT_BYTES,
    MAX_TAIL_LINE_BYTES,
    escape_control_bytes,
    escape_controls,
    parse_json,
    read_capped,
)

HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\\x00\u202eevil"


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()`` in a thread; fail (instead of hanging the suite) when it blocks."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the test thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        # unblock a reader stuck in open() of a FIFO so the thread can end
        raise AssertionError(f"blocked for more than {seconds} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def unblock(fifo: Path) -> None:
    """Open the FIFO for writing without blocking, so a reader stuck on it returns."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def result_dict(**over: Any) -> dict[str, Any]:
    r = StepResult(app_id="a-1", state="FAILED", exit_code=3, replicas=[ReplicaResult("w", 0, "FAILED", 3)])
    return {**r.to_dict(), **over}


# -- the reader -----------------------------------------------------------------------------
def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "outputs.json"
    os.mkfifo(fifo)
    try:
        data, why = within(10, lambda: read_capped(fifo, 1024, what="rank 0's outputs file"))
    finally:
        unblock(fifo)
    assert data is None and why == f"rank 0's outputs file {fifo}: refused: not a regular file"


def test_a_symlink_is_refused_never_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "s3cr3t"}')
    link = tmp_path / "outputs.json"
    link.symlink_to(secret)
    data, why = read_capped(link, 1024, what="outputs file")
    assert data is None and why is not None and "refused: is a symlink" in why


def test_a_file_over_its_cap_is_refused_without_reading_it(tmp_path: Path) -> None:
    big = tmp_path / "outputs.json"
    with open(big, "wb") as f:
        f.truncate(100 << 20)  # 100 MB, sparse: never read
    data, why = read_capped(big, untrusted.MAX_OUTPUTS_BYTES, what="outputs file")
    assert data is None and why is not None
    assert f"refused: {100 << 20} bytes, over the cap of {untrusted.MAX_OUTPUTS_BYTES}" in why


def test_a_directory_and_a_missing_file(tmp_path: Path) -> None:
    assert read_capped(tmp_path, 10, what="f")[1] == f"f {tmp_path}: refused: not a regular file"
    assert read_capped(tmp_path / "none", 10, what="f") == (None, None)


# -- the parser -----------------------------------------------------------------------------
@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 985, 10**5])
def test_deep_nesting_is_refused_with_a_warning_never_raised(depth: int) -> None:
    value, notes = parse_json("[" * depth + "]" * depth, what="outputs")
    assert value is None and notes == [f"outputs: refused: nested deeper than {MAX_JSON_DEPTH} levels"]


def test_nesting_at_the_cap_is_kept() -> None:
    depth = MAX_JSON_DEPTH
    value, notes = parse_json('{"a":' * depth + "1" + "}" * depth, what="outputs")
    assert notes == [] and value is not None


def test_non_finite_numbers_become_strings_with_a_warning() -> None:
    value, notes = parse_json('{"nan": NaN, "inf": Infinity, "ninf": -Infinity, "big": 1e999, "ok": 0.5}', what="o")
    assert value == {"nan": "NaN", "inf": "Infinity", "ninf": "-Infinity", "big": "Infinity", "ok": 0.5}
    assert 'o.nan: NaN is not a JSON number; kept as the string "NaN"' in notes
    assert 'o.big: Infinity is not a JSON number; kept as the string "Infinity"' in notes
    json.dumps(value, allow_nan=False)  # what Airflow's XCom push does


@pytest.mark.parametrize(
    ("text", "why"),
    [(b"\xff\xfe", "not UTF-8 text"), (b'{"a": ', "not JSON"), (b"1" * 5000, "not JSON")],
)
def test_garbage_is_refused_with_a_warning(text: bytes, why: str) -> None:
    value, notes = parse_json(text, what="error file")
    assert value is None and len(notes) == 1 and why in notes[0]


# -- StepResult.load (the local supervisor's reader) ---------------------------------------
def test_load_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "result.json"
    os.mkfifo(fifo)
    try:
        with pytest.raises(ValueError, match="refused: not a regular file"):
            within(10, lambda: StepResult.load(fifo))
    finally:
        unblock(fifo)


def test_load_refuses_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps(result_dict()))
    (tmp_path / "result.json").symlink_to(real)
    with pytest.raises(ValueError, match="refused: is a symlink"):
        StepResult.load(tmp_path / "result.json")


def test_load_refuses_a_file_over_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    with open(path, "wb") as f:
        f.truncate(untrusted.MAX_RESULT_READ_BYTES + 1)
    with pytest.raises(ValueError, match="over the cap"):
        StepResult.load(path)


def test_load_refuses_deep_nesting_with_a_value_error_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text('{"schema": 1, "app_id": "a", "state": "SUCCEEDED", "outputs": ' + "[" * 10**5 + "]" * 10**5 + "}")
    with pytest.raises(ValueError, match="nested deeper than"):
        StepResult.load(path)


def test_load_keeps_what_is_valid_and_names_each_field_of_the_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    data = result_dict(restarts="x", outputs=[1, 2], duration_s=1e999, root_cause={"role": 5})
    path.write_text(json.dumps(data))
    r = StepResult.load(path)
    assert (r.state, r.exit_code, r.restarts, r.outputs, r.root_cause) == ("FAILED", 3, 0, {}, None)
    text = "\n".join(r.warnings)
    assert "result.restarts: refused str 'x'; expected int" in text
    assert "result.outputs: refused list [1, 2]; expected dict[str, Any]" in text
    assert "result.duration_s: refused" in text and "result.root_cause" in text
    assert StepResult.load(path).to_json()  # and it can be published again


def test_load_of_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        StepResult.load(tmp_path / "none.json")


# -- non-finite numbers: one rule everywhere ------------------------------------------------
def test_a_nan_output_is_the_string_nan_in_every_rendering_with_a_warning() -> None:
    r = StepResult("a-1", "SUCCEEDED", 0, outputs={"acc": float("nan"), "loss": float("inf"), "n": 1})
    assert r.outputs == {"acc": "NaN", "loss": "Infinity", "n": 1}
    assert any('outputs.acc: NaN is not a JSON number; kept as the string "NaN"' == w for w in r.warnings)
    text = r.to_json()
    assert "NaN," not in text.replace('"NaN"', "")  # no bare NaN token
    json.loads(text, parse_constant=lambda name: pytest.fail(f"bare {name} in result.json"))
    json.dumps(r.to_dict(), allow_nan=False)
    assert StepResult.from_summary(r.summary()) is not None
    json.loads(r.summary(), parse_constant=lambda name: pytest.fail(f"bare {name} in the summary"))


def test_a_non_finite_duration_is_published_as_a_string_too() -> None:
    r = StepResult("a-1", "SUCCEEDED", 0, duration_s=float("nan"))
    assert r.to_dict()["duration_s"] == "NaN"
    json.dumps(r.to_dict(), allow_nan=False)


# -- sizes ----------------------------------------------------------------------------------
def test_a_result_over_its_cap_cuts_tails_then_drops_outputs_with_warnings() -> None:
    line = "x" * MAX_TAIL_LINE_BYTES
    ranks = [RankResult("w", i, i, "FAILED", 1, tail=[line] * 50) for i in range(64)]
    r = StepResult(
        "a-1",
        "FAILED",
        1,
        replicas=[ReplicaResult("w", 0, "FAILED", 1, ranks=ranks)],
        root_cause=ranks[0],
        outputs={"blob": "y" * (MAX_RESULT_BYTES // 2)},
    )
    data = r.to_dict()
    size = len(json.dumps(data))
    assert size <= MAX_RESULT_BYTES, size
    assert all(len(rk["tail"]) <= 5 for rk in data["replicas"][0]["ranks"])
    assert any("each rank's tail cut to its last 5 lines" in w for w in data["warnings"])
    assert StepResult.from_dict(data).exit_code == 1  # still a result


def test_an_outputs_blob_alone_over_the_cap_is_dropped_with_a_warning() -> None:
    r = StepResult("a-1", "SUCCEEDED", 0, outputs={"blob": "y" * (MAX_RESULT_BYTES + 10)})
    data = r.to_dict()
    assert data["outputs"] == {} and len(json.dumps(data)) <= MAX_RESULT_BYTES
    assert f"result over {MAX_RESULT_BYTES} bytes: the outputs were dropped" in data["warnings"]
    assert r.outputs  # the in-memory result is left alone: only what is published is cut


# -- control characters ---------------------------------------------------------------------
def test_root_cause_line_escapes_what_a_worker_wrote() -> None:
    rank = RankResult("w", 1, 1, "FAILED", 1, message="exited with code 1", tail=[f"ValueError: {HOSTILE}"])
    line = root_cause_line(rank)
    assert not any(ch in line for ch in "\x1b\x07\x00\u202e")
    assert line.startswith("ValueError: \\x1b[2J\\x1b]0;owned\\x07") and "\\u202eevil" in line


def test_root_cause_line_is_one_line_of_bounded_length() -> None:
    rank = RankResult("w", 0, 0, "FAILED", 1, message="x" * 10**6 + "\nsecond", traceback="tb")
    line = root_cause_line(rank)
    assert "\n" not in line and len(line) < MAX_TAIL_LINE_BYTES + 100


def test_escaping_keeps_text_tabs_and_newlines_and_is_stable() -> None:
    assert escape_controls("plain\ttext\n") == "plain\ttext\n"
    once = escape_controls(HOSTILE)
    assert escape_controls(once) == once  # escaping twice changes nothing
    assert escape_control_bytes(HOSTILE.encode()).decode() == once
    assert escape_control_bytes("é ✓ \u0085".encode()) == "é ✓ \\x85".encode()
