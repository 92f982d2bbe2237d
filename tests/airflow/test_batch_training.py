"""dags/airflow/batch_training.py in real ``dag.test()`` runs (small sizes, faults injected):
prepare is retried by Airflow exactly once, the killed rank costs one agent restart round
and training resumes at its epoch, results reach downstream, the model beats chance, the
model Asset schedules ``evaluate_on_new_model``. A non-retryable error failing the run at
once (train's one try, its root cause) is asserted by tests/e2e/test_demo.py, whose
non-retryable scenario is this DAG's ``dag.test()`` with the same conf."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=170)
@pytest.mark.timeout(900)  # two dag.test runs (400 s and 240 s at most): ~100 s on a quiet machine
def test_faults_are_survived_and_the_model_reaches_downstream(dag_tester, tmp_path: Path) -> None:
    conf = {
        "workdir": str(tmp_path),
        "samples": 800,
        "epochs": 3,
        "fail_once": True,
        "kill_rank": 1,
        "kill_at_epoch": 1,
    }
    run = dag_tester.run("batch_training", conf, timeout=400)
    tasks = run["tasks"]
    assert run["state"] == "success", run["output"][-4000:]
    assert {t: v["state"] for t, v in tasks.items()} == dict.fromkeys(
        ("prepare", "train", "publish_model", "evaluate"), "success"
    )
    assert tasks["prepare"]["try_number"] == 2  # failed once, retried by Airflow exactly once
    assert tasks["train"]["try_number"] == 1
    trained = tasks["train"]["xcom"]["outputs"]
    assert [h["epoch"] for h in trained["history"]] == [0, 1, 2] and trained["first_epoch"] == 1
    assert [h["restart"] for h in trained["history"]] == [0, 1, 1]  # one restart round of the agent
    scored = tasks["evaluate"]["xcom"]["outputs"]
    assert scored["accuracy"] > scored["chance"] + 0.4
    assert tasks["publish_model"]["xcom"] == trained["model"]
    # the DAG scheduled on the model Asset evaluates it
    again = dag_tester.run("evaluate_on_new_model", {"data": str(tmp_path / "data"), "model": trained["model"]})
    assert again["state"] == "success" and again["tasks"]["evaluate"]["xcom"]["outputs"]["accuracy"] > 0.65


def test_the_model_asset_schedules_the_evaluation_dag() -> None:
    spec = importlib.util.spec_from_file_location("batch_training_dag", ROOT / "dags" / "airflow" / "batch_training.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    training, evaluation = module.batch_training, module.evaluate_on_new_model
    assert training.catchup is False and training.schedule == "@daily"
    assert module.MODEL in training.get_task("publish_model").outlets
    assert module.MODEL.uri in str(evaluation.timetable.asset_condition)


def test_the_checkpoint_dir_option_reaches_the_ranks_and_training_resumes(dag_tester, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    (ckpt / "epoch-004").write_text("4")  # what an earlier try saved before its worker died
    run = dag_tester.run("torchstep_checkpoint", {"ckpt": str(ckpt)})
    assert run["state"] == "success", run["output"][-4000:]
    assert run["tasks"]["train"]["xcom"]["outputs"] == {"first_epoch": 5}
    assert sorted(p.name for p in ckpt.iterdir()) == [f"epoch-{i:03d}" for i in range(4, 7)]
