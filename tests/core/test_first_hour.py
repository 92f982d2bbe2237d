"""The first hour of a new user (issue 37 §3): each stumble, as the user meets it on the
command line, asserted on what is printed — one clear line that says what to do, the exit
code, and no traceback — from a directory of the user's own (not the repository)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPONENTS = ROOT / "components" / "train.py"
#: The README's five-line training script: top-level code, no component in it.
SCRIPT = """import torch, torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())]); dist.all_reduce(t)
print(f"rank {dist.get_rank()} of {dist.get_world_size()}: sum of ranks {t.item():g}")
dist.destroy_process_group()
"""


@pytest.fixture
def user_dir(tmp_path: Path) -> Path:
    """A directory of the user's own, with the README's train.py in it."""
    (tmp_path / "train.py").write_text(SCRIPT)
    return tmp_path


def run(cwd: Path, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KF_PIPELINES")}
    env.update({"HOME": str(cwd), "XDG_STATE_HOME": str(cwd / "state")})
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(p: subprocess.CompletedProcess[str], prefix: str) -> str:
    """The one line the user reads: no traceback, and the line starts with ``prefix``."""
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    lines = [x for x in p.stderr.splitlines() if x.startswith(prefix)]
    assert len(lines) == 1, out
    return lines[0]


# -- 1. torchx run --dryrun -s kfp needs no endpoint; a SpecError is one line under torchx's CLI --------
def test_kfp_dryrun_needs_no_endpoint_and_a_submission_says_so_in_one_line(user_dir: Path) -> None:
    dry = run(user_dir, "torchx", "run", "--dryrun", "-s", "kfp", "dist.ddp", "-j", "2x2", "--script", "train.py")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "# kfp endpoint: (none yet: a submission needs -cfg endpoint=" in dry.stdout
    assert "pipelineInfo" in dry.stdout  # the compiled pipeline

    sub = run(user_dir, "torchx", "run", "-s", "kfp", "dist.ddp", "-j", "2x2", "--script", "train.py")
    assert sub.returncode == 1
    line = one_error_line(sub, "torchx: error:")
    assert "cfg['endpoint']" in line and "no KFP endpoint" in line and "fix: -cfg endpoint=https://" in line


def test_the_readme_uses_the_environments_torchx() -> None:
    readme = (ROOT / "README.md").read_text()
    bare = [x for x in readme.splitlines() if re.match(r"torchx (run|status)", x)]
    assert not bare, bare
    assert ".venv/bin/torchx run --dryrun -s kfp dist.ddp" in readme


# -- 5. help and a misspelt command ------------------------------------------------------------------
def test_help_is_plain_text_and_a_misspelt_command_suggests_the_right_one(user_dir: Path) -> None:
    h = run(user_dir, "torchstep", "--help")
    assert h.returncode == 0
    assert "usage: torchstep COMMAND" in h.stdout and "torchstep run REF -- --help" in h.stdout
    assert ":func:" not in h.stdout and "``" not in h.stdout

    p = run(user_dir, "torchstep", "rnu", "dist.ddp")
    assert p.returncode == 2
    assert p.stdout == ""
    assert (
        one_error_line(p, "torchstep:")
        == "torchstep: unknown command 'rnu' (did you mean 'run'?); see torchstep --help"
    )


# -- 6. options vs component arguments; a component's parameters --------------------------------------
def test_component_arguments_before_the_separator_get_a_hint(user_dir: Path) -> None:
    p = run(user_dir, "torchstep", "run", f"{COMPONENTS}:trainer", "--replicas", "2")
    assert p.returncode == 2
    line = one_error_line(p, "torchstep run: error:")
    assert f"component arguments go after '--': torchstep run {COMPONENTS}:trainer -- --replicas 2" in line


@pytest.mark.parametrize("command", [["run"], ["explain", "--target", "kfp"]])
def test_separator_help_lists_the_components_parameters(user_dir: Path, command: list[str]) -> None:
    p = run(user_dir, "torchstep", command[0], f"{COMPONENTS}:trainer", *command[1:], "--", "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"{COMPONENTS}:trainer: the component's parameters; pass them after --")
    assert "--replicas int" in p.stdout and "nodes (one torchstep-agent each) (default: 2)" in p.stdout
    assert "torchx run <run args...>" not in p.stdout


# -- 7. wrong component names ------------------------------------------------------------------------
def test_a_misspelt_builtin_suggests_the_builtin_and_torchstep_builtins(user_dir: Path) -> None:
    p = run(user_dir, "torchstep", "run", "dist.dpp")
    assert p.returncode == 2
    line = one_error_line(p, "torchstep run: error:")
    assert "'dist.dpp' is not a TorchX builtin component (did you mean 'dist.ddp'?)" in line
    assert "`torchstep builtins`" in line and "torchx builtins" not in line

    b = run(user_dir, "torchstep", "builtins")
    assert b.returncode == 0 and {"dist.ddp", "utils.echo", "utils.python"} <= set(b.stdout.split())


def test_a_misspelt_component_function_lists_the_files_components(user_dir: Path) -> None:
    p = run(user_dir, "torchstep", "explain", f"{COMPONENTS}:trainr", "--target", "local")
    assert p.returncode == 2
    line = one_error_line(p, "torchstep explain: error:")
    assert "has no function 'trainr'" in line
    assert "use one of: trainer, prepare, train, evaluate (did you mean 'trainer'?)" in line


def test_a_component_file_without_a_function_says_so(user_dir: Path) -> None:
    p = run(user_dir, "torchstep", "explain", str(COMPONENTS), "--target", "local")
    assert p.returncode == 2
    line = one_error_line(p, "torchstep explain: error:")
    assert "is a file: a component reference names a function in it" in line
    assert f"{COMPONENTS}:trainer, {COMPONENTS}:prepare" in line and "builtins" not in line


# -- 8. a training script is never executed as a component file ------------------------------------
def test_a_training_script_named_as_a_component_is_not_executed(user_dir: Path) -> None:
    marker = user_dir / "ran"
    (user_dir / "train2.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef main():\n    pass\n")
    for ref, said in [
        ("train.py:main", "train.py has no function 'main'"),
        ("train2.py:main", "train2.py:main is not a component"),
    ]:
        p = run(user_dir, "torchstep", "run", ref)
        assert p.returncode == 2
        line = one_error_line(p, "torchstep run: error:")
        assert said in line and "it looks like a training script" in line, line
        assert "torchstep run dist.ddp -- -j 1x2 --script" in line
        assert "init_process_group" not in p.stderr
    assert not marker.exists()  # the file's top-level code never ran


def test_a_function_that_returns_no_appdef_is_named(user_dir: Path) -> None:
    (user_dir / "comps.py").write_text("def helper(x: int = 1) -> int:\n    return x\n")
    p = run(user_dir, "torchstep", "explain", "comps.py:helper", "--target", "local")
    line = one_error_line(p, "torchstep explain: error:")
    assert "comps.py:helper has validation errors" in line and "incorrect return annotation" in line


# -- 9. explain --target airflow|prefect ---------------------------------------------------------------
@pytest.mark.parametrize(("target", "where"), [("airflow", "AppDefOperator"), ("prefect", "app_task")])
def test_explain_for_an_orchestrator_says_which_targets_its_steps_use(user_dir: Path, target: str, where: str) -> None:
    p = run(user_dir, "torchstep", "explain", "utils.echo", "--target", target)
    assert p.returncode == 2
    line = one_error_line(p, "torchstep explain: error:")
    assert f"'{target}' is not a target: {target.capitalize()} steps run on the local or kubernetes target" in line
    assert where in line and "choose from local, kubernetes, kfp" in line


# -- 10. a missing script fails before anything starts --------------------------------------------------
def test_a_missing_script_is_one_line_and_nothing_starts(user_dir: Path) -> None:
    p = run(user_dir, "torchstep", "run", "dist.ddp", "--", "-j", "1x2", "--script", "nope.py")
    assert p.returncode == 2
    line = one_error_line(p, "torchstep run: error:")
    assert f"runs the script 'nope.py', which does not exist in {user_dir}" in line and "nothing was started" in line
    assert "ChildFailedError" not in p.stderr and "PENDING" not in p.stdout
    assert not (user_dir / "state").exists()  # no run directory: nothing started


# -- 4. a replica is "role replica N"; "[role/N]" is always rank N ----------------------------------------
def test_replicas_and_ranks_are_named_apart(user_dir: Path) -> None:
    from torchstep.schedulers.base import role_of_line

    p = run(user_dir, "torchstep", "run", "utils.echo", "--", "--msg", "hi", "--num_replicas", "2", timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torchstep: echo replica 1 SUCCEEDED (exit 0)" in p.stdout
    assert "[echo/1] hi" in p.stdout  # rank 1's line
    assert re.search(r"^  echo replica 1: SUCCEEDED \(exit 0\), ranks 1, logs ", p.stdout, re.M), p.stdout
    assert not re.search(r"torchstep: echo/\d", p.stdout)  # no replica written as role/N
    # torchx log splits an orchestrator's one log by role with both forms
    assert role_of_line("torchstep: echo replica 1 SUCCEEDED (exit 0)", ["echo"]) == "echo"
    assert role_of_line("[echo/1] hi", ["echo"]) == "echo"


# -- 12. the agent's help; one grace period; explain never cuts a name --------------------------------
def test_agent_help_says_each_default_once_and_the_grace_period_is_one_default(user_dir: Path) -> None:
    from torchstep.agent.settings_table import setting
    from torchstep.local.options import resolve

    h = run(user_dir, "torchstep-agent", "--help")
    assert h.returncode == 0
    text = " ".join(h.stdout.split())
    assert "replica id reported in the result (env TORCHSTEP_REPLICA_ID; default this agent's node rank)" in text
    assert "default off" not in text.partition("--replica-id N, --replica_id N")[2][:200]
    assert "(torch: 30) (env TORCHSTEP_GRACE_PERIOD; default 10)" in text
    assert setting("grace_period").default == resolve({}).grace_period == 10.0  # the agent's = torchstep run's


def test_explain_wraps_values_between_names_not_inside_them(user_dir: Path) -> None:
    p = run(user_dir, "torchstep", "explain", "dist.ddp", "--target", "kfp", "--", "-j", "2x2", "--script", "t.py")
    assert p.returncode == 0, p.stderr
    values = {}
    for line in p.stdout.splitlines():
        cells = line.split(" | ")
        if len(cells) == 4 and cells[0].strip():
            field = cells[0].strip()
        if len(cells) == 4:
            values.setdefault(field, []).append(cells[1].strip())
    assert values["roles[0].image"][0] == "ghcr.io/pytorch/torchx:0.7.0"  # whole, on one line
    for field, pieces in values.items():  # a piece that is cut ends at a separator, never inside a name
        for piece in pieces[:-1]:
            last = piece.split()[-1] if piece.split() else ""
            assert not re.search(r"[A-Za-z0-9]{2}$", last) or len(last) < 20, (field, pieces)


# -- 13. the API reference leads with the functions a user calls --------------------------------------
def test_the_api_reference_leads_with_the_functions_and_groups_the_data_classes_after() -> None:
    import torchstep

    page = (ROOT / "docs" / "reference" / "torchstep.md").read_text()
    shown = re.findall(r"^::: torchstep\.(\w+)$", page, re.M)
    public = [n for n in torchstep.__all__ if n != "kubernetes"]  # kubernetes: a page of its own
    assert sorted(shown) == sorted(public)  # every public name, once
    assert shown[:4] == ["materialize", "build_plan", "explain", "run_local"]
    assert shown[-2:] == ["StepPlan", "RolePlan"]  # the long data classes last
    assert "members: false" in page  # the package heading does not list every member again


# -- 2. a component run from another directory: one line naming where to run it ----------------------
def test_a_component_whose_script_is_elsewhere_says_where_to_run_it(user_dir: Path) -> None:
    hello = user_dir / "hello"
    hello.mkdir()
    p = run(hello, "torchstep", "run", f"{COMPONENTS}:trainer", "--", "--replicas", "1")
    assert p.returncode == 2
    line = one_error_line(p, "torchstep run: error:")
    assert f"runs the script 'components/apps/train.py', which does not exist in {hello}" in line
    assert f"fix: run torchstep from {ROOT}, where components/apps/train.py is" in line
    assert "restart" not in p.stdout + p.stderr  # nothing started, so no restart was spent on it


def test_the_tutorial_runs_section_6_from_the_clones_root() -> None:
    text = (ROOT / "docs" / "tutorial.md").read_text()
    six = text[text.index("## 6. Faults, on purpose") :]
    blocks = re.findall(r"```bash\n(.*?)```", six, re.S)
    assert blocks[0].startswith("cd ..\n")  # from hello/ back to the clone's root, where the scripts are
    prepare = next(i for i, b in enumerate(blocks) if "components/train.py:prepare" in b)
    train = next(i for i, b in enumerate(blocks) if "components/train.py:train --" in b and "--kill_rank" in b)
    assert prepare < train  # the dataset is written before train reads it


# -- 3. the demo: moved logs named where they are, restarts explained, the index path whole -------------
def _demo_module():  # noqa: ANN202 - a module loaded from its file
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo_first_hour", ROOT / "dags" / "demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_demos_moved_run_directories_name_where_they_are(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    demo = _demo_module()
    out = io.StringIO()
    d = demo.Demo(True, tmp_path, demo.Progress(Console(file=out, width=60), None))
    runs = tmp_path / "runs" / "kfp" / "faults" / "torchstep"
    run_dir = runs / "train-1a2b3c"
    (run_dir / "train" / "0").mkdir(parents=True)
    (run_dir / "result.json").write_text(f'{{"state": "SUCCEEDED", "log_dir": "{run_dir}", "restarts": 2}}')
    (run_dir / "train" / "0" / "agent.log").write_text(f"logs in {run_dir}/train/0/attempt_0\n")
    d.collect_logs("kfp", "faults", runs)
    moved = tmp_path / "logs" / "kfp" / "faults" / "train" / "try1"
    assert not run_dir.exists()
    assert f'"log_dir": "{moved}"' in (moved / "result.json").read_text()
    assert (moved / "train" / "0" / "agent.log").read_text() == f"logs in {moved}/train/0/attempt_0\n"
    index = d.write_index().read_text()
    assert "its `restarts` counts every replica's agent restarts" in " ".join(index.split())
    assert "| kfp | faults | train | 1 | SUCCEEDED | kfp/faults/train/try1/ |" in index


def test_the_demo_says_what_its_restarts_count_and_no_outcome_before_a_run_ends() -> None:
    demo = _demo_module()
    assert "a step's result.json counts every replica's restarts" in demo.LEGEND
    for scenario, said in demo.SCENARIOS.items():  # the progress line printed when the run starts
        assert "survived" not in said.replace("must be survived", ""), (scenario, said)
        assert "must" in said, (scenario, said)
    source = (ROOT / "dags" / "demo.py").read_text()
    assert 'print(f"index: {demo.write_index()}", highlight=False, soft_wrap=True)' in source


# -- 11. noise: no OMP_NUM_THREADS banner per agent, no NumPy warning from torchstep's own torch import ----
def test_a_run_prints_no_omp_banner_and_no_numpy_warning_where_numpy_is_missing(user_dir: Path) -> None:
    nonumpy = user_dir / "nonumpy" / "numpy"  # an environment without numpy: torch works, and warns
    nonumpy.mkdir(parents=True)
    (nonumpy / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'numpy\'", name="numpy")\n')
    (user_dir / "comp.py").write_text(
        "import torchx.specs as specs\n\n\n"
        "def two(n: int = 2) -> specs.AppDef:\n"
        '    """Two workers that need no numpy.\n\n    Args:\n        n: workers\n    """\n'
        '    role = specs.Role("two", image=".", entrypoint="python", args=["-c", "print(\'hello\')"],\n'
        '                      metadata={"torchstep": {"nproc_per_node": n}})\n'
        '    return specs.AppDef("two", roles=[role])\n'
    )
    env = {
        **os.environ,
        "HOME": str(user_dir),
        "XDG_STATE_HOME": str(user_dir / "state"),
        "PYTHONPATH": str(nonumpy.parent),
    }
    env.pop("OMP_NUM_THREADS", None)
    p = subprocess.run(
        [str(BIN / "torchstep"), "run", "comp.py:two"],
        cwd=user_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert out.count("[two/") == 2 and "hello" in out
    assert "OMP_NUM_THREADS" not in out and "*****" not in out
    assert "Failed to initialize NumPy" not in out
