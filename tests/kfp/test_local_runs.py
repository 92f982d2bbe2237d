"""The same pipelines under kfp.local (SubprocessRunner): the components run the same argv as
a lightweight component; the example's prepare → train (2 DDP processes, gloo) → evaluate
with the result, a Metrics and a Model artifact passed along; pipeline parameters reaching
the step at run time; the AppDef's APPLICATION budget kept inside the step (kfp.local
ignores set_retry): a failure recovers exactly once, a non-retryable one never retries."""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.
import json
import os
import subprocess
import sys
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest

kfp = pytest.importorskip("kfp")
from kfp import dsl, local  # noqa: E402
from torchstep import SpecError  # noqa: E402
from torchstep_kfp import component_from_fn  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parents[1] / "apps"
ECHO = f"{APPS / 'steps.py'}:echo"
FLAKY = f"{APPS / 'steps.py'}:flaky"
#: The canary an injected shell would create: unique to this session, so a file some other
#: run on the machine left in the shared temporary directory is never taken for ours.
PWNED = Path(tempfile.gettempdir()) / f"torchstep-pwned-{uuid.uuid4().hex[:12]}"
TEXT = "{{$.inputs.parameters['lr']}} $(touch " + str(PWNED) + ") `id` ; python3 {{ ds }}"


@pytest.fixture
def kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    yield tmp_path
    local.config.LocalExecutionConfig.instance = None


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def read_metrics(metrics: dsl.Input[dsl.Metrics], result: dict) -> dict:
    return {"metrics": dict(metrics.metadata), "state": result["state"], "app_id": result["app_id"]}


def test_pipeline_parameters_reach_the_step_at_run_time_and_outputs_flow_on(kfp_local: Path) -> None:
    echo = component_from_fn(ECHO, outputs={"app_id": str}, metrics=True)

    @dsl.pipeline
    def pipe(lr: float, name: str) -> dict:
        step = echo(lr=lr, name=name, tags=["a b", "c"], extra={"k": "v w"}, debug=True)
        return read_metrics(metrics=step.outputs["metrics"], result=step.outputs["result"]).output

    first = pipe(lr=0.7, name=TEXT).output
    assert first["state"] == "SUCCEEDED"
    assert first["metrics"] == {"accuracy": 0.75, "loss": 0.35}  # rank 0's metrics, from the run-time lr
    second = pipe(lr=0.2, name="x").output
    assert second["metrics"]["loss"] == 0.1
    assert first["app_id"] != second["app_id"]  # the KFP run id reaches the app id

    @dsl.pipeline
    def outputs(lr: float) -> dict:
        return echo(lr=lr, name=TEXT, tags=["a b", "c"], extra={"k": "v w"}, debug=True).outputs["result"]

    result = outputs(lr=0.5).output
    assert result["outputs"]["lr"] == 0.5
    assert result["outputs"]["name"] == TEXT  # verbatim: no placeholder resolved, no shell, python3 kept
    assert result["outputs"]["tags"] == ["a b", "c"]
    assert result["outputs"]["extra"] == {"k": "v w"}
    assert result["outputs"]["debug"] == "True"
    assert not PWNED.exists()


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def result_types(result: dict) -> str:
    """What a downstream task gets: the result as KFP hands it, and read with the schema."""
    import json

    from torchstep import StepResult

    typed = StepResult.from_dict(result).to_dict()

    def types(d: dict) -> dict:
        return {k: type(d[k]).__name__ for k in ("exit_code", "attempts", "restarts", "schema", "duration_s")}

    rep = typed["replicas"][0]
    return json.dumps(
        {
            "given": types(result),
            "typed": types(typed),
            "typed_dict": typed,
            "replica": [type(rep[k]).__name__ for k in ("replica_id", "exit_code", "restarts")],
            "rank": [type(rep["ranks"][0][k]).__name__ for k in ("rank", "local_rank", "exit_code")],
        }
    )


def test_a_downstream_task_reads_the_result_with_the_types_of_its_schema(kfp_local: Path) -> None:
    """KFP carries a dict output as a protobuf Struct, whose numbers are doubles: under
    kfp.local every int of the result reaches the next task as a float (0.0). The result's
    reader, ``StepResult.from_dict``, gives them back as the schema declares them."""
    echo = component_from_fn(ECHO)

    @dsl.pipeline
    def pipe() -> str:
        return result_types(result=echo(lr=0.3).outputs["result"]).output

    seen = json.loads(pipe().output)
    want = {"exit_code": "int", "attempts": "int", "restarts": "int", "schema": "int", "duration_s": "float"}
    assert seen["typed"] == want, seen
    assert seen["replica"] == ["int", "int", "int"] and seen["rank"] == ["int", "int", "int"], seen
    assert seen["typed_dict"]["exit_code"] == 0 and seen["typed_dict"]["state"] == "SUCCEEDED"


def test_kfp_local_does_not_warn_about_the_steps_image(kfp_local: Path) -> None:
    """The SubprocessRunner runs a step in this machine's Python: KFP's RuntimeWarning about a
    "custom or non-Python base image" (once per task) would tell the user to use Docker."""
    echo = component_from_fn(ECHO, image="ghcr.io/acme/train:1")

    @dsl.pipeline
    def pipe() -> dict:
        first = echo(lr=0.1)
        return echo(lr=0.2).after(first).outputs["result"]

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert pipe().output["state"] == "SUCCEEDED"
    assert not [w for w in seen if "base image" in str(w.message)], [str(w.message) for w in seen]


def test_a_misspelt_input_names_the_inputs_there_are(kfp_local: Path) -> None:
    echo = component_from_fn(ECHO)
    with pytest.raises(
        SpecError, match=r"has no parameter 'lrr'; fix: use one of: lr, epochs, name.*did you mean 'lr'"
    ):

        @dsl.pipeline
        def pipe() -> dict:
            return echo(lrr=0.1).outputs["result"]


def test_a_step_that_fails_once_recovers_exactly_once(kfp_local: Path) -> None:
    flaky = component_from_fn(FLAKY, marker="", max_retries=1)  # set_retry(1) when compiled
    marker = kfp_local / "attempts"

    @dsl.pipeline
    def pipe(marker: str) -> dict:
        return flaky(marker=marker, fail_times=1).outputs["result"]

    result = pipe(marker=str(marker)).output
    assert result["state"] == "SUCCEEDED" and result["outputs"] == {"attempts": 2}
    assert marker.read_text().count("attempt") == 2


def test_a_spent_budget_fails_the_pipeline(kfp_local: Path) -> None:
    flaky = component_from_fn(FLAKY, marker="", max_retries=1)
    marker = kfp_local / "attempts"

    @dsl.pipeline
    def pipe(marker: str):
        flaky(marker=marker, fail_times=5)

    with pytest.raises(RuntimeError, match="FAILURE"):
        pipe(marker=str(marker))
    assert marker.read_text().count("attempt") == 2  # 1 try + 1 retry, no more


def test_a_non_retryable_failure_fails_the_pipeline_without_a_second_attempt(kfp_local: Path) -> None:
    flaky = component_from_fn(FLAKY, marker="", max_retries=3)
    marker = kfp_local / "attempts"

    @dsl.pipeline
    def pipe(marker: str):
        flaky(marker=marker, non_retryable=True)

    with pytest.raises(RuntimeError, match="FAILURE"):
        pipe(marker=str(marker))
    assert marker.read_text().count("attempt") == 1


def test_a_failed_step_logs_its_root_cause_by_its_last_meaningful_line(
    kfp_local: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A missing script: the step's log says python's "can't open file", not "exited with code 2"."""
    missing = component_from_fn(f"{APPS / 'steps.py'}:missing_script", path="")
    script = kfp_local / "missing.py"

    @dsl.pipeline
    def pipe(path: str):
        missing(path=path)

    with pytest.raises(RuntimeError, match="FAILURE"):
        pipe(path=str(script))
    out, err = capfd.readouterr()
    (line,) = [
        x for x in (out + err).splitlines() if "FAILED (exit code 2); root cause: rank 0 (trainer replica 0): " in x
    ]
    assert f"can't open file '{script}'" in line


def test_the_example_pipeline_trains_with_two_ddp_processes_and_evaluates(tmp_path: Path) -> None:
    root = tmp_path / "root"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "dags/kfp/run_local.py", "--steps", "20", "--pipeline-root", str(root)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("pipeline output:")]
    assert "loss" in line and "model.pt" in line
    (train_dir,) = root.glob("torchstep-train-*/trainer")
    result = json.loads((train_dir / "result").read_text())
    assert result["state"] == "SUCCEEDED"
    assert sorted(r["rank"] for rep in result["replicas"] for r in rep["ranks"]) == [0, 1]  # 2 DDP processes
    assert result["outputs"]["world_size"] == 2
    executor_output = json.loads((train_dir / "executor_output.json").read_text())
    metrics = executor_output["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["loss"] < metrics["first_loss"]
    assert (train_dir / "model").stat().st_size > 0  # the model rank 0 saved, copied into the artifact
    # the rank logs of both processes are kept
    logs = list((tmp_path / "state").rglob("rank*.log"))
    assert len(logs) == 2


def compiled_args(tmp_path: Path, runner: object) -> tuple[list[str], list[str]]:
    from kfp import compiler

    op = component_from_fn(FLAKY, marker="", max_retries=1)
    local.init(runner=runner, pipeline_root=str(tmp_path / "root"))
    try:

        @dsl.pipeline
        def pipe(marker: str):
            op(marker=marker)

        compiler.Compiler().compile(pipe, str(tmp_path / "p.yaml"))
    finally:
        local.config.LocalExecutionConfig.instance = None
    import yaml

    (executor,) = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))["deploymentSpec"]["executors"].values()
    return executor["container"]["command"], executor["container"]["args"]


def test_each_kfp_local_runner_gets_the_form_it_can_run(tmp_path: Path) -> None:
    command, args = compiled_args(tmp_path, local.SubprocessRunner(use_venv=False))
    assert command[:2] == ["sh", "-ec"] and "kfp.dsl.executor_main" in command[2]  # a lightweight component
    assert args[0].startswith("from torchstep_kfp.entry import") and "--spec" in args
    command, args = compiled_args(tmp_path, local.DockerRunner())  # needs Docker only to run
    assert command == ["python3", "-m", "torchstep_kfp.entry"] and args[-1] == "--kfp-local"


def test_the_docker_form_spends_the_retry_budget_in_the_step(tmp_path: Path, monkeypatch) -> None:
    """DockerRunner ignores set_retry too: --kfp-local keeps the budget in the step (run here
    without Docker: the same entry point the container runs)."""
    import json as _json

    from torchstep_kfp import entry

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _, args = compiled_args(tmp_path, local.DockerRunner())
    spec = args[args.index("--spec") + 1]
    marker = tmp_path / "attempts"
    out = tmp_path / "out"
    executor_input = {
        "outputs": {
            "parameters": {"result": {"outputFile": str(out / "result")}},
            "outputFile": str(out / "executor_output.json"),
        }
    }
    argv = [
        "--spec",
        spec,
        "--executor_input",
        _json.dumps(executor_input),
        "--in",
        "marker",
        str(marker),
        "--in",
        "fail_times",
        "1",
        "--kfp-local",
    ]
    assert entry.main(argv) == 0
    assert marker.read_text().count("attempt") == 2
    assert _json.loads((out / "result").read_text())["outputs"] == {"attempts": 2}


COUNTING = f"{Path(__file__).resolve().parent / 'apps' / 'counting.py'}:counting"


def test_the_steps_last_progress_is_in_its_metrics_artifact(kfp_local: Path) -> None:
    """A step whose ranks call torchstep.progress(step, total): its Metrics artifact (what the
    KFP UI shows as the task's scalar metrics) holds the last report beside rank 0's metrics,
    and the result parameter the whole progress."""
    counting = component_from_fn(COUNTING, metrics=True)

    @dsl.pipeline
    def pipe(steps: int) -> dict:
        step = counting(steps=steps)
        return read_metrics(metrics=step.outputs["metrics"], result=step.outputs["result"]).output

    got = pipe(steps=4).output
    assert got["state"] == "SUCCEEDED"
    metrics = got["metrics"]
    assert metrics["loss"] == 0.25  # the step's own metric is kept
    assert (metrics["progress_step"], metrics["progress_total"], metrics["progress_percent"]) == (4, 4, 100)
    assert metrics["progress_eta_s"] == 0 and 0.5 < metrics["progress_rate"] < 10, metrics  # ~3.3 steps/s
    (executor_output,) = kfp_local.glob("root/**/counting/executor_output.json")
    result = json.loads(executor_output.read_text())["parameterValues"]["result"]
    assert (result["progress"]["step"], result["progress"]["total"]) == (4, 4)


def test_several_replicas_without_a_cluster_fail_in_one_line(
    kfp_local: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """Under kfp.local a step of several replicas is a launcher of Kubernetes Jobs: with no
    cluster configured it fails at once, non-retryable, with one line that says why and what
    to do, not the Kubernetes client's traceback."""
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(kfp_local))  # no ~/.kube/config
    nodes = component_from_fn(f"{APPS / 'steps.py'}:nodes")

    @dsl.pipeline
    def pipe():
        nodes(replicas=2)

    with pytest.raises(RuntimeError, match="FAILURE"):
        pipe()
    out, err = capfd.readouterr()
    text = out + err
    (line,) = [x.strip() for x in text.splitlines() if "torchstep: the kubernetes target:" in x]
    assert "no cluster to run on: Invalid kube-config file" in line and "give it one replica there" in line
    assert "Traceback" not in text and "ConfigException" not in text, text[-3000:]
