"""``torchstep render`` / ``torchstep runopts kubernetes``, the package's import cost, and
the docstring examples."""

from __future__ import annotations

import doctest
import importlib
import subprocess
import sys

import pytest
import torchstep.kubernetes
import yaml
from torchstep.cli import main as torchstep_main
from torchstep.kubernetes import runopts
from torchstep.kubernetes.options import _OPTS, KubernetesOptions, resolve


def test_render_prints_valid_yaml(capsys, check):
    argv = ["render", "dist.ddp", "-n", "ml", "--run-id", "run-1", "--cfg", "queue=team-a", "--cfg", "labels=team:ml"]
    assert torchstep_main([*argv, "--", "-j", "2x2", "--script", "train.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# torchstep: app 'train', run train-4e65d3fb, namespace ml\n")
    assert "-l torchstep/app-id=train-4e65d3fb" in out
    objs = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objs] == ["Service", "Job"]
    for o in objs:
        assert o["metadata"]["labels"]["team"] == "ml"
    assert objs[1]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    rendered = torchstep.kubernetes.render_app(
        torchstep.materialize("dist.ddp", ["-j", "2x2", "--script", "train.py"]),
        namespace="ml",
        cfg={"run_id": "run-1", "queue": "team-a", "labels": "team:ml"},
    )
    assert objs == check(rendered)


def test_render_notes_and_errors(capsys, tmp_path):
    comp = tmp_path / "comp.py"
    comp.write_text(
        "from torchx import specs\n"
        "def app(retries: int = 2) -> specs.AppDef:\n"
        "    return specs.AppDef('a', [specs.Role('t', 'img:1', entrypoint='python', args=['x.py'],\n"
        "        max_retries=retries, retry_policy=specs.RetryPolicy.REPLICA)])\n"
    )
    assert torchstep_main(["render", f"{comp}:app", "--", "--retries", "3"]) == 0
    out = capsys.readouterr().out
    assert "# note: roles[0]: 1 replica rendered as an Indexed Job of 1" in out
    assert [o["kind"] for o in yaml.safe_load_all(out)] == ["Job"]
    assert torchstep_main(["render", f"{comp}:app", "--cfg", "queue=Bad Queue"]) == 2
    assert "cfg['queue']" in capsys.readouterr().err
    assert torchstep_main(["render", f"{comp}:app", "--cfg", "queue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_runopts(capsys):
    opts = runopts()
    assert {name: opt.default for name, opt in opts} == {name: default for name, (_, default, _) in _OPTS.items()}
    assert resolve({}) == KubernetesOptions()
    assert opts.resolve({"queue": "q"})["queue"] == resolve({"queue": "q"}).queue == "q"
    assert torchstep_main(["runopts", "kubernetes"]) == 0
    out = capsys.readouterr().out
    assert "namespace=NAMESPACE" in out and "queue" in out and "kueue.x-k8s.io/queue-name" in out


def test_import_is_cheap():
    code = (
        "import sys, torchstep, torchstep.kubernetes\n"
        "torchstep.kubernetes.render(torchstep.materialize('utils.echo', ['--msg', 'x']))\n"
        "bad = [m for m in ('torch', 'kubernetes', 'yaml', 'airflow', 'kfp', 'prefect') if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("module", ["__init__", "failure", "options", "overlay", "pod", "render"], ids=str)
def test_docstring_examples(module):
    name = "torchstep.kubernetes" if module == "__init__" else f"torchstep.kubernetes.{module}"
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


def test_docs_example_is_current(capsys):
    """docs/kubernetes.md shows real output of the command it names."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    command = "torchstep render dist.ddp -n ml --run-id manual__2026-11-21T10:00:00 --cfg queue=team-a -- -j 2x4 --gpu 4 --memMB 65536 --cpu 16 --script train.py -- --lr 0.1"
    assert f"`{command}`" in doc
    assert torchstep_main(command.split()[1:]) == 0
    out = capsys.readouterr().out
    example = doc.split(f"`{command}`", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    assert example == out
