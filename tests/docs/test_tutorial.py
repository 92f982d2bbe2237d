"""docs/tutorial.md runs as written: every file it says to save is saved from its code
block, every shell block runs in order in one shell (from a directory that stands for the
clone's root, with the repository's environment as its ``.venv``), and each command prints
what the tutorial says — the Airflow path included (``airflow db migrate``, ``airflow dags
test hello`` in the tutorial's own DAG folder: no recursive walk into ``.venv``, no import
of ``tests/``). Only ``make demo`` is left out (tests/e2e/test_demo.py runs the demo).

``python tests/docs/test_tutorial.py DIR`` writes the tutorial's script to DIR/tutorial.sh
(to run it by hand from a fresh clone)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
BLOCK = re.compile(r"```(\w+)\n(.*?)```", re.S)
SAVE_AS = re.compile(r"`([\w./-]+\.py)`:\s*$")
SKIPPED = {"make demo\n"}  # run by tests/e2e/test_demo.py
MARK = "=== tutorial block "


def steps(text: str) -> list[tuple[str, str]]:
    """The tutorial's steps in order: ("file", path + "\\n" + content) or ("bash", commands)."""
    out: list[tuple[str, str]] = []
    for m in BLOCK.finditer(text):
        lang, body = m.group(1), m.group(2)
        prose = text[: m.start()].rstrip().splitlines()[-1]
        if lang == "python":
            saved = SAVE_AS.search(prose)
            assert saved, f"a python block that is not a file to save: {body[:80]!r}"
            out.append(("file", f"{saved.group(1)}\n{body}"))
        elif lang == "bash" and body not in SKIPPED:
            out.append(("bash", body))
    return out


def script(text: str) -> str:
    """One bash script doing the tutorial's steps, each block's output after a marker."""
    lines = ["set -euo pipefail"]
    for n, (kind, body) in enumerate(steps(text)):
        lines.append(f"echo '{MARK}{n} ({kind})'")
        if kind == "file":
            path, _, content = body.partition("\n")
            lines += [f"cat > {path} <<'TUTORIAL_EOF'", content.rstrip("\n"), "TUTORIAL_EOF"]
        else:
            lines.append(body.rstrip("\n"))
    return "\n".join(lines) + "\n"


def test_every_block_is_a_step() -> None:
    found = steps(TUTORIAL.read_text())
    files = [body.partition("\n")[0] for kind, body in found if kind == "file"]
    assert files == ["my_component.py", "hello.py", "dags/hello_dag.py", "hello_pipeline.py", "hello_flow.py"]
    assert any("airflow db migrate" in body for kind, body in found if kind == "bash")


@pytest.mark.slow(seconds=280)
@pytest.mark.timeout(900)
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    clone = tmp_path / "clone"  # stands for the clone's root: its .venv and prefect.toml
    clone.mkdir()
    (clone / ".venv").symlink_to(ROOT / ".venv")
    (clone / "prefect.toml").write_text((ROOT / "prefect.toml").read_text())
    shutil.copytree(ROOT / "components", clone / "components")  # section 6 runs the clone's own components
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PREFECT_", "VIRTUAL_ENV"))}
    env.update({"HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state"), "TMPDIR": str(tmp_path)})
    proc = subprocess.run(
        ["bash", "-c", script(TUTORIAL.read_text())], cwd=clone, env=env, capture_output=True, text=True, timeout=840
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    blocks = {}
    for part in proc.stdout.split(MARK)[1:]:
        head, _, body = part.partition("\n")
        blocks[int(head.split()[0])] = body
    found = steps(TUTORIAL.read_text())
    by_command = {body.strip().splitlines()[0]: blocks[n] for n, (kind, body) in enumerate(found) if kind == "bash"}

    hello = clone / "hello"
    checks = by_command[
        "python -c \"from torchx.specs.file_linter import validate; print(validate('my_component.py', 'hello_ddp'))\""
    ]
    assert checks.splitlines()[0] == "[]", checks[:2000]
    assert "torchstep explain: app 'hello' on target 'kfp' — 1 warning(s)" in checks
    assert re.search(r"roles\[0\]\.image\s+\| \.\s+\| WARNING", checks), checks[:4000]
    assert re.search(r"torchstep: hello-\S+ SUCCEEDED", checks), checks[-3000:]

    airflow = by_command[
        'export AIRFLOW_HOME="$PWD/airflow-home" AIRFLOW__CORE__DAGS_FOLDER="$PWD/dags" '
        "AIRFLOW__CORE__LOAD_EXAMPLES=False"
    ]
    for wrong in ("Detected recursive loop", "Failed to import", "ImportError"):
        assert wrong not in out, f"{wrong!r}:\n{out[-6000:]}"
    assert re.search(r"DagRun Finished: dag_id=hello, .*state=success", airflow), airflow[-4000:]
    assert "[worker/0] rank 0 of 4: 1048576.0" in airflow and "[worker/3] rank 3 of 4: 1048576.0" in airflow

    kfp = by_command["python hello_pipeline.py"]
    assert (hello / "hello.yaml").exists() and "sum: 32.0" in kfp, kfp[-4000:]
    prefect = by_command["cp ../prefect.toml ."] + by_command["python hello_flow.py"]
    assert "sum: 1048576.0" in prefect, prefect[-4000:]
    # section 6, from the clone's root: a component's parameters, a retry, a restart, a non-retryable stop
    assert "--kill_rank int" in by_command["cd .."], by_command["cd .."][-2000:]
    prepare = by_command["torchstep run components/train.py:prepare -- --out hello/data --fail_once True"]
    assert "SUCCEEDED after 2 tries" in prepare, prepare[-3000:]
    (train,) = [v for k, v in by_command.items() if "--kill_rank 1" in k]
    assert re.search(r"torchstep: train-\S+ SUCCEEDED in .*, 1 restart\(s\)", train), train[-3000:]
    (stop,) = [v for k, v in by_command.items() if "--non_retryable True" in k]
    assert "root cause: rank " in stop and "NonRetryableError" in stop and "exit code 82" in stop, stop[-3000:]
    # the faults of section 6 are on purpose: the non-retryable rank prints its traceback, and
    # the survivor of the killed rank prints the collective's error before the group restarts
    quiet = out.replace(stop, "").replace(train, "")
    for noise in ("database is locked", "Traceback", "non-Python base image"):
        assert noise not in quiet, f"{noise!r}:\n{quiet[-6000:]}"


if __name__ == "__main__":
    target = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    (target / "tutorial.sh").write_text(script(TUTORIAL.read_text()))
    print(target / "tutorial.sh")
