"""dags/prefect/batch_training.py with faults injected (small sizes): the killed rank costs
one restart round and training resumes at the killed epoch, the step that fails once is
retried by Prefect exactly once, results reach downstream, the model beats chance; a
non-retryable error fails at once with its root cause."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("prefect")
from prefect.client.orchestration import get_client  # noqa: E402
from torchstep_prefect import StepFailed  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("prefect_harness")


def example():
    spec = importlib.util.spec_from_file_location("batch_training", ROOT / "dags" / "prefect" / "batch_training.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_faults_are_survived_and_results_flow_downstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    flow = example().batch_training
    state = flow(
        workdir=str(tmp_path), samples=800, epochs=3, kill_rank=1, kill_at_epoch=1, fail_once=True, return_state=True
    )
    assert state.is_completed()
    out = state.result()
    history = out["train"]["outputs"]["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2] and out["train"]["outputs"]["first_epoch"] == 1
    assert [h["restart"] for h in history] == [0, 1, 1]  # one restart round, the epoch counter continued
    assert out["evaluate"]["outputs"]["accuracy"] > out["evaluate"]["outputs"]["chance"] + 0.4
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs()
    by_name = {}
    for run in runs:
        if run.flow_run_id == state.state_details.flow_run_id:
            by_name[run.name.rsplit("-", 1)[0]] = run
    assert by_name["prepare"].run_count == 2  # failed once, retried exactly once by Prefect
    assert by_name["train"].run_count == 1 and by_name["evaluate"].run_count == 1


def test_a_non_retryable_error_fails_at_once_with_its_root_cause(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with pytest.raises(StepFailed) as e:
        example().batch_training(workdir=str(tmp_path), samples=400, epochs=2, non_retryable=True)
    assert e.value.retryable is False and "retrying cannot help" in str(e.value)
