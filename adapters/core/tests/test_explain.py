"""``torchstep.explain`` and ``torchstep explain``: one row per field with its value and
what it becomes (or why it is ignored / rejected, with the fix); the package imports
without torch; the docstring examples of the spec layer hold."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest
import torchstep
from torchx.specs import AppDef, BindMount, Role

TARGETS = ("local", "kubernetes", "kfp")
CLI = [sys.executable, "-m", "torchstep.cli"]


def rows(text: str) -> dict[str, tuple[str, str, str]]:
    """field -> (value, action, becomes) of each row of a table (wrapped cells joined)."""
    out: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for line in text.splitlines()[4:]:
        cells = [c.strip() for c in line.split(" | ")]
        if len(cells) != 4:
            continue
        if cells[2]:  # the first line of a row
            current = [[c] for c in cells]
            out.setdefault(cells[0], current)
        else:
            for parts, cell in zip(current, cells, strict=True):
                if cell:
                    parts.append(cell)
    return {"".join(f): (" ".join(v), a[0], " ".join(b)) for f, v, a, b in (tuple(cols) for cols in out.values())}


@pytest.mark.parametrize("target", TARGETS)
def test_ddp_table_has_a_row_per_field(target: str) -> None:
    app = torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"])
    text = torchstep.explain(app, target)
    head = text.splitlines()[0]
    # TorchX's default image has no torchstep: a warning wherever an image is pulled
    status = "OK" if target == "local" else "1 warning(s)"
    assert head == f"torchstep explain: app 'train' on target '{target}' — {status}"
    table = rows(text)
    for field in (
        "name",
        "metadata",
        "roles",
        "roles[0].name",
        "roles[0].image",
        "roles[0].base_image",
        "roles[0].entrypoint",
        "roles[0].args",
        "roles[0].env",
        "roles[0].num_replicas",
        "roles[0].min_replicas",
        "roles[0].resource.cpu",
        "roles[0].resource.gpu",
        "roles[0].resource.memMB",
        "roles[0].resource.devices",
        "roles[0].resource.capabilities",
        "roles[0].mounts",
        "roles[0].port_map['c10d']",
        "roles[0].max_retries",
        "roles[0].retry_policy",
        "roles[0].metadata",
        "roles[0].macros",
    ):
        assert field in table, f"no row for {field}:\n{text}"
    assert table["roles[0].num_replicas"][0] == "2"
    assert table["roles[0].image"][1] == ("ignored" if target == "local" else "WARNING")
    assert all(len(line) <= 120 for line in text.splitlines())


def test_rejected_rows_carry_the_fix() -> None:
    app = AppDef("a", [Role("r", image="img:1", entrypoint="python", mounts=[BindMount("/a", "/b")])])
    text = torchstep.explain(app, "kfp")
    value, action, becomes = rows(text)["roles[0].mounts[0]"]
    assert (value, action) == ("bind /a -> /b", "REJECTED")
    assert "KFP v2 has no hostPath mounts" in becomes
    assert "fix: use a VolumeMount (PVC)" in becomes
    assert text.splitlines()[0].endswith("— 1 field(s) rejected")


def test_env_values_are_never_shown() -> None:
    app = AppDef("a", [Role("r", image="img:1", entrypoint="python", env={"TOKEN": "s3cr3t-value"})])
    for target in TARGETS:
        assert "s3cr3t" not in torchstep.explain(app, target)


def test_explain_never_raises_and_escapes_control_characters() -> None:
    for thing in (None, "x", AppDef("a\nb\x1b[31m", []), AppDef("a", [None]), AppDef(None, None, None)):  # type: ignore[arg-type]
        for target in (*TARGETS, "gke"):
            text = torchstep.explain(thing, target)
            assert "REJECTED" in text and "\x1b" not in text
            assert all(line.isprintable() for line in text.splitlines())


def test_explain_works_in_any_import_order() -> None:
    # importing the table module first must not shadow the function
    code = (
        "import torchstep.plan.explain, torchstep\n"
        "app = torchstep.materialize('utils.echo', ['--image', 'ghcr.io/acme/echo:1'])\n"
        "print(torchstep.explain(app, 'kfp').splitlines()[0])\n"
        "from torchstep.plan.explain import explain\n"
        "print(explain(app, 'local').splitlines()[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.splitlines() == [
        "torchstep explain: app 'echo' on target 'kfp' — OK",
        "torchstep explain: app 'echo' on target 'local' — OK",
    ]


def test_importing_torchstep_does_not_import_torch() -> None:
    code = (
        "import sys, torchstep\n"
        "app = torchstep.materialize('dist.ddp', ['--script', 't.py'])\n"
        "torchstep.explain(app, 'kfp'); torchstep.build_plan(app, 'kubernetes')\n"
        "import torchstep.launch, torchstep.plan.names, torchstep.plan.macros, torchstep.plan.rules.resources\n"
        "print(sorted(m for m in ('torch', 'airflow', 'kfp', 'prefect', 'kubernetes') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"


# ---- the command line ---------------------------------------------------------------------------
def test_cli_explain_ddp_on_kfp() -> None:
    argv = [
        *CLI,
        "explain",
        "dist.ddp",
        "--target",
        "kfp",
        "--",
        "-j",
        "2x2",
        "--script",
        "train.py",
        "--image",
        "ghcr.io/acme/train:1",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    table = rows(out.stdout)
    assert out.stdout.startswith("torchstep explain: app 'train' on target 'kfp' — OK")
    assert table["roles[0].num_replicas"][2].startswith("launcher step submitting an Indexed Job of 2")
    assert table["roles[0].entrypoint+args"][1] == "yes" and len(table) >= 20


def test_cli_explain_rejection_and_bad_component() -> None:
    rejected = subprocess.run(
        [*CLI, "explain", "metrics.tensorboard", "-t", "kfp", "--", "--logdir", "/l"], capture_output=True, text=True
    )
    assert rejected.returncode == 2 and "REJECTED" in rejected.stdout
    bad = subprocess.run([*CLI, "explain", "dist.ddp", "-t", "kfp", "--", "--nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "torchstep explain: error: component.nope: dist.ddp has no parameter 'nope'; fix: use one of:" in bad.stderr


def test_cli_explain_says_what_happens_to_an_image_that_is_a_local_directory(tmp_path) -> None:
    """``image="."`` (the local target's working directory) cannot be pulled by a cluster:
    rejected on kubernetes (rendered objects only run on a cluster); on KFP a warning,
    because kfp.local's SubprocessRunner runs the step on this machine in that directory."""
    (tmp_path / "comp.py").write_text(
        "import torchx.specs as specs\n\n\n"
        'def hello(image: str = ".") -> specs.AppDef:\n'
        '    """Hello.\n\n    Args:\n        image: image\n    """\n'
        '    return specs.AppDef("hello", [specs.Role("w", image=image, entrypoint="echo", args=["hi"])])\n'
    )

    def explain(target: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [*CLI, "explain", "comp.py:hello", "--target", target, "--", *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    kubernetes = explain("kubernetes")
    assert kubernetes.returncode == 2 and "— 1 field(s) rejected" in kubernetes.stdout.splitlines()[0]
    value, action, becomes = rows(kubernetes.stdout)["roles[0].image"]
    assert (value, action) == (".", "REJECTED")
    assert "path on this machine, not an image a cluster can pull" in becomes
    assert "fix: build an image with your code and `pip install" in becomes
    kfp = explain("kfp")
    assert kfp.returncode == 0 and kfp.stdout.splitlines()[0].endswith("— 1 warning(s)"), kfp.stdout
    value, action, becomes = rows(kfp.stdout)["roles[0].image"]
    assert (value, action) == (".", "WARNING") and "kfp.local's SubprocessRunner runs the step here" in becomes
    assert "fix: for a cluster: build an image" in becomes
    local = explain("local")
    assert local.stdout.splitlines()[0].endswith("— OK") and rows(local.stdout)["roles[0].image"][1] == "yes"
    for target in ("kubernetes", "kfp"):  # an image reference: no word about it
        assert explain(target, "--image", "registry.example.com/team/hello:1").stdout.splitlines()[0].endswith("OK")


def test_cli_builtins_lists_the_torchx_builtins() -> None:
    out = subprocess.run([*CLI, "builtins"], check=True, capture_output=True, text=True).stdout.split()
    assert {"dist.ddp", "utils.echo", "utils.sh"} <= set(out)


# ---- the examples in the docstrings of the spec layer -------------------------------------------
SPEC_MODULES = [
    "torchstep.contract",
    "torchstep.errors",
    "torchstep.files",
    "torchstep.launch",
    "torchstep.local",
    "torchstep.local.rundir",
    "torchstep.result",
    "torchstep.plan",
    "torchstep.plan.agent_command",
    "torchstep.plan.cmdline",
    "torchstep.components.builders",
    "torchstep.plan.explain",
    "torchstep.plan.limits",
    "torchstep.plan.macros",
    "torchstep.plan.model",
    "torchstep.plan.names",
    "torchstep.plan.options",
    "torchstep.plan.planner",
    "torchstep.plan.rules.command",
    "torchstep.plan.rules.metadata",
    "torchstep.plan.rules.record",
    "torchstep.plan.rules.replicas",
    "torchstep.plan.rules.resources",
    "torchstep.plan.rules.retry",
    "torchstep.plan.fixed",
    "torchstep.steps",
    "torchstep.policy",
    "torchstep.policy.checks",
    "torchstep.policy.overlay",
    "torchstep.policy.rules",
    "torchstep.cfg_table",
    "torchstep.plan.secrets",
    "torchstep.local.prepare",
    "torchstep.local.options",
    "torchstep.outputs",
    "torchstep.kubernetes.hostpod",
    "torchstep.schedulers.generic",
]


@pytest.mark.parametrize("name", SPEC_MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
