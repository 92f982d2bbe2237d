"""kfp.local has no UI: what it prints is what a user sees. The same three steps as the
Airflow and Prefect pages (tests/browser/apps/kfp_pipeline.py, 1 replica x 4 ranks: under
kfp.local a step of several replicas is a launcher of Kubernetes Jobs) — one succeeds, one
fails with a non-retryable error on rank 3, one hangs until its ``timeout`` run option — run
side by side, each in its own process, and their output read for the same things: every
rank's lines, prefixed and whole; the root cause last; where each rank was when the hang was
stopped, and where the rest (the stacks, the rank logs) is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from browser.pages import where_ranks_were

pytest.importorskip("kfp")

# one module, one deployment: `make unit` runs a module in one xdist worker (tests/conftest.py)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PIPELINE = Path(__file__).resolve().parent / "apps" / "kfp_pipeline.py"
LINES = 300  # apps/kfp_pipeline.py: LINES
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def printed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Each mode's printed lines (stdout and stderr as one stream, colours removed)."""
    tmp = tmp_path_factory.mktemp("kfp")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state")}
    procs = {
        mode: subprocess.Popen(
            [sys.executable, str(PIPELINE), mode, str(tmp / mode)],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for mode in ("ok", "fail", "hang")
    }
    out = {}
    for mode, p in procs.items():
        text, _ = p.communicate(timeout=600)
        out[mode] = [ANSI.sub("", x) for x in text.splitlines()]
    return out


def test_the_failed_step_prints_every_rank_whole_and_the_root_cause_last(printed) -> None:
    lines = [x.strip() for x in printed["fail"]]
    for rank in range(4):
        numbered = [x for x in lines if x.startswith(f"[trainer/{rank}] rank {rank} of 4 line ")]
        assert numbered == [f"[trainer/{rank}] rank {rank} of 4 line {i} of {LINES}" for i in range(1, LINES + 1)]
        wide = next(x for x in lines if x.startswith(f"[trainer/{rank}] rank {rank} wide line "))
        assert wide.endswith(" end of the wide line")  # nothing cut on the console
    assert "[trainer/3] torchstep.errors.NonRetryableError: rank 3: shard 3 is corrupt: retrying cannot help" in lines
    summary = [x for x in lines if re.match(r"ranks-fail-\w+ FAILED", x)]
    assert summary, lines[-40:]
    assert "root cause: rank 3 (trainer replica 0): NonRetryableError: rank 3: shard 3 is corrupt" in summary[-1]
    assert lines[-1].startswith("KFP_RAISED RuntimeError: Pipeline 'pipeline' finished with status FAILURE")
    # a non-retryable failure runs once: one run directory, no second try
    assert len({m.group(1) for x in lines if (m := re.search(r"torchstep: (ranks-fail-\w+): logs and result", x))}) == 1


def test_the_timed_out_step_prints_where_every_rank_was(printed) -> None:
    lines = [x.strip() for x in printed["hang"]]
    text = "\n".join(lines)
    assert re.search(r"ranks-hang-\w+ FAILED \(exit code 124\); timed out after 60 s; every process was stopped", text)
    where = next(x for x in lines if "CANCELLED" in x and "where the ranks were:" in x)
    assert where_ranks_were(where), where
    stacks = re.search(r"every thread in (\S+stacks\.txt)", text)
    assert stacks and Path(stacks.group(1)).is_file()
    assert "load_batch" in Path(stacks.group(1)).read_text()


def test_the_succeeded_step_prints_every_rank_and_returns_its_result(printed) -> None:
    lines = [x.strip() for x in printed["ok"]]
    for rank in range(4):
        assert f"[trainer/{rank}] rank {rank} done" in lines
    assert lines[-1] == "KFP_RESULT SUCCEEDED", lines[-40:]
