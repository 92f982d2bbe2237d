"""A step stopped by Prefect (its task timed out, its flow run cancelled) still shows what it
did in the Prefect UI: its ``-ranks`` table and ``-outputs`` markdown, like a step that ended
by itself (found by the soak's prefect surface: a cancelled step had no artifact at all;
the cancel through a served flow is its ``prefect:cancel`` run, in ``make test``'s smoke)."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
import json
import uuid
from pathlib import Path

import pytest
from proclib import procs_with_env, wait_for

pytest.importorskip("prefect")
from prefect import flow  # noqa: E402
from prefect.artifacts import Artifact  # noqa: E402
from torchstep_prefect import app_task  # noqa: E402

STEPS = Path(__file__).resolve().parents[1] / "apps" / "steps.py"

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture(autouse=True)
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


@pytest.mark.parametrize("submitted", [False, True], ids=["called", "submitted"])
def test_a_timed_out_step_publishes_its_ranks_and_outputs(submitted: bool) -> None:
    mark = f"prefect-stopped-{uuid.uuid4().hex[:8]}"
    name = f"stopped-{uuid.uuid4().hex[:8]}"
    # the timeout must fire after the rank started: 6 s did not on a loaded machine (load average 15)
    sleeper = app_task(f"{STEPS}:sleeper", defaults={"mark": mark}, timeout_seconds=20, name=name)

    @flow
    def pipeline() -> str:
        if submitted:  # a worker thread: the task stops the step itself
            future = sleeper.submit(mark=mark)
            future.wait(120)
            return future.state.name
        return sleeper(mark=mark, return_state=True).name

    assert pipeline() == "TimedOut"
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "every process of the step to end")
    outputs = Artifact.get(f"{name}-outputs")
    assert outputs is not None, "the stopped step published no -outputs artifact"
    assert outputs.data.startswith("**sleeper-") and ": CANCELLED (exit 143," in outputs.data
    ranks = Artifact.get(f"{name}-ranks")
    assert ranks is not None, "the stopped step published no -ranks artifact"
    rows = json.loads(ranks.data) if isinstance(ranks.data, str) else ranks.data
    assert [(r["role"], r["replica"], r["rank"]) for r in rows] == [("sleeper", 0, 0)]
    assert rows[0]["state"] == "CANCELLED" and rows[0]["log"].endswith("rank0.log")
