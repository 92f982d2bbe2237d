"""One plan per task call, and no silent drop between compile time and run time (issue 25,
item 5). KFP fixes a task's image, resources, mounts, Secrets, node selectors, retries and
shape when the pipeline is compiled: a call is planned with its compile-time constants
(checked in the YAML the real KFP compiler writes), and a run-time input that would change
such a field fails the step at once, naming the field and the input (checked under
``kfp.local``, and on the entry point the container runs)."""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

kfp = pytest.importorskip("kfp")
pytest.importorskip("kfp.kubernetes")
from kfp import compiler, dsl, local  # noqa: E402
from torchstep import SpecError  # noqa: E402
from torchstep_kfp import component_from_fn, entry  # noqa: E402

APPS = Path(__file__).resolve().parents[1] / "apps"
CKPT = f"{APPS / 'steps.py'}:ckpt"
NODES = f"{APPS / 'steps.py'}:nodes"


def compiled(tmp_path: Path, pipeline: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pipeline spec and the kfp-kubernetes platform spec the real compiler writes."""
    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    spec, *platform = yaml.safe_load_all(out.read_text())
    return spec, (platform[0]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if platform else {})


def executor_of(spec: dict[str, Any], task: str) -> str:
    component = spec["root"]["dag"]["tasks"][task]["componentRef"]["name"]
    return str(spec["components"][component]["executorLabel"])


def test_each_call_is_planned_with_its_compile_time_constants(tmp_path: Path) -> None:
    """``train_op(lr=lr, tag="withpvc")``: the constant decides the mount, so the task mounts
    the claim; the call without it (the default tag) mounts nothing; the pipeline parameter
    ``lr`` keeps the default, and each task carries what it was compiled with."""
    train_op = component_from_fn(CKPT)

    @dsl.pipeline
    def pipe(lr: float = 0.1) -> None:
        train_op(lr=lr, tag="withpvc").set_display_name("with")
        train_op(lr=lr).set_display_name("without")

    spec, executors = compiled(tmp_path, pipe)
    with_pvc, without = (executor_of(spec, t) for t in ("ckpt", "ckpt-2"))
    assert [(m["constant"], m["mountPath"]) for m in executors[with_pvc]["pvcMount"]] == [("ckpt", "/ckpt")]
    assert "pvcMount" not in executors.get(without, {})
    tasks = spec["root"]["dag"]["tasks"]
    carried = {
        t: json.loads(tasks[t]["inputs"]["parameters"][entry.COMPILED_INPUT]["runtimeValue"]["constant"])
        for t in ("ckpt", "ckpt-2")
    }
    assert carried["ckpt"]["fixed"]["roles[0].mounts"] == ["volume ckpt -> /ckpt"]
    assert carried["ckpt"]["planned_with"]["tag"] == "withpvc" and carried["ckpt"]["planned_with"]["lr"] == 0.1
    assert "roles[0].mounts" not in carried["ckpt-2"]["fixed"]  # no mount (an unset field is left out)


def test_a_constant_that_changes_the_steps_shape_is_refused_when_the_pipeline_is_defined() -> None:
    nodes = component_from_fn(NODES)  # 2 replicas by default: a launcher step

    with pytest.raises(SpecError, match="needs one container, but the component was made for the other shape"):

        @dsl.pipeline
        def pipe() -> None:
            nodes(replicas=1)


@pytest.fixture
def kfp_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"))
    yield tmp_path
    local.config.LocalExecutionConfig.instance = None


def test_a_run_time_input_that_changes_a_compiled_field_fails_the_step_before_it_runs(
    kfp_local: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """``tag`` from a pipeline parameter: compiled with the default (no mount), run with
    "withpvc" (a mount KFP never made: the checkpoints would go to the container's disk)."""
    train_op = component_from_fn(CKPT)
    marker = kfp_local / "ran"

    @dsl.pipeline
    def pipe(tag: str, marker: str) -> None:
        train_op(tag=tag, marker=marker)

    with pytest.raises(RuntimeError, match="FAILURE"):
        pipe(tag="withpvc", marker=str(marker))
    err = "".join(capfd.readouterr())
    assert not marker.exists()  # failed before anything ran
    assert "roles[0].mounts (target 'kfp'): KFP fixed it at compile time to none" in err
    assert "tag='withpvc' (compiled with 'nopvc')" in err
    assert "fix: pass 'tag' as a constant in the pipeline" in err

    @dsl.pipeline
    def same(tag: str, marker: str) -> None:  # the run-time value leaves the fixed fields alone
        train_op(tag=tag, marker=marker)

    same(tag="other", marker=str(marker))
    assert marker.read_text() == "0.1\n"


def test_the_same_value_as_a_constant_is_compiled_and_runs(kfp_local: Path) -> None:
    """The fix the error names: the constant's mount is compiled into the task, so inside the
    step the claim is the pod's (dropped from the local run, as the pod mounted it)."""
    train_op = component_from_fn(CKPT)
    marker = kfp_local / "ran"

    @dsl.pipeline
    def pipe(lr: float, marker: str) -> None:
        train_op(lr=lr, tag="withpvc", marker=marker)

    pipe(lr=0.5, marker=str(marker))
    assert marker.read_text() == "0.5\n"  # the run-time lr reached the step; lr fixes nothing


def argv(tmp_path: Path, op: Any, compiled_with: Any, **inputs: Any) -> list[str]:
    """The container's argv for these input values (what KFP's launcher passes)."""
    args = op.component.component_spec.implementation.container.args
    given = {"torchstep_job_id": "job-1"}
    if compiled_with is not None:
        given[entry.COMPILED_INPUT] = json.dumps(compiled_with)
    executor_input = {
        "inputs": {"parameterValues": given},
        "outputs": {
            "parameters": {"result": {"outputFile": str(tmp_path / "result")}},
            "outputFile": str(tmp_path / "executor_output.json"),
        },
    }
    out = ["--spec", args[args.index("--spec") + 1], "--executor_input", json.dumps(executor_input)]
    for name, value in inputs.items():
        out += ["--in", name, value if isinstance(value, str) else json.dumps(value)]
    return out


def test_the_entry_point_names_each_changed_field_and_the_input_that_changed_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    op = component_from_fn(CKPT)
    defaults = op.spec["planned_with"]
    # compiled with the defaults (no COMPILED_INPUT: the component's own), run with tag=withpvc
    assert entry.main(argv(tmp_path, op, None, tag="withpvc", lr=0.3)) == 2
    err = capsys.readouterr().err
    assert "roles[0].mounts" in err and "tag='withpvc' (compiled with 'nopvc')" in err and "lr=" not in err
    # the task compiled with the constant: the same run-time values are what it was made for
    with_pvc = {
        "fixed": entry.fixed_of(op.plan_of_call({"tag": "withpvc"})[0], op.spec),
        "planned_with": {**defaults, "tag": "withpvc"},
    }
    assert entry.main(argv(tmp_path, op, with_pvc, tag="withpvc", marker=str(tmp_path / "m"))) == 0
    assert (tmp_path / "m").read_text() == "0.1\n"
