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
from torchstep.kubernetes import cfg_table
from torchstep.kubernetes.options import _OPTS, KubernetesOptions, resolve


def test_render_prints_valid_yaml(capsys, check):
    argv = ["render", "dist.ddp", "-n", "ml", "--run-id", "run-1", "--cfg", "queue=team-a", "--cfg", "labels=team:ml"]
    assert torchstep_main([*argv, "--", "-j", "2x2", "--script", "train.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# torchstep: app 'train', run train-4e65d3fb, namespace ml\n")
    assert "-l torchstep/app-id=train-4e65d3fb" in out
    objs = list(yaml.safe_load_all(out))
    assert [o["kind"] for o in objs] == ["Service", "NetworkPolicy", "Job"]
    for o in objs:
        assert o["metadata"]["labels"]["team"] == "ml"
    assert objs[2]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
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


def test_render_warns_of_an_image_without_torchstep_and_image_replaces_every_one(capsys, tmp_path, check):
    ddp = ["--", "-j", "2x4", "--script", "train.py"]
    assert torchstep_main(["render", "dist.ddp", "-n", "ml", *ddp]) == 0
    out, err = capsys.readouterr()
    assert "image: ghcr.io/pytorch/torchx:0.7.0" in out  # still rendered: the objects are valid
    assert err.startswith("torchstep render: warning: roles[0].image: 'ghcr.io/pytorch/torchx:0.7.0' has no torchstep")
    assert (
        "python -m torchstep.launch" in err
        and 'fix: build an image FROM it with `pip install "torchstep[agent]"`' in err
    )
    # the component's own --image (dist.ddp takes one), or render's --image: no warning
    assert torchstep_main(["render", "dist.ddp", "-n", "ml", *ddp, "--image", "ghcr.io/acme/train:1"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and "image: ghcr.io/acme/train:1" in out
    comp = tmp_path / "two.py"
    comp.write_text(
        "from torchx import specs\n"
        "def app() -> specs.AppDef:\n"
        "    return specs.AppDef('a', [specs.Role('t', 'ghcr.io/pytorch/torchx:0.7.0', entrypoint='python'),\n"
        "                              specs.Role('s', 'pytorch/pytorch:2.5.0', entrypoint='python')])\n"
    )
    assert torchstep_main(["render", f"{comp}:app"]) == 0
    assert capsys.readouterr().err.count("has no torchstep") == 2  # one warning per role
    assert torchstep_main(["render", f"{comp}:app", "--image", "registry.example.com/ml/train:2"]) == 0
    out, err = capsys.readouterr()
    objs = list(yaml.safe_load_all(out))
    pods = [o["spec"]["template"]["spec"] if o["kind"] == "Job" else o["spec"] for o in objs if o["kind"] != "Service"]
    images = [c["image"] for pod in pods for c in pod["containers"]]
    assert err == "" and images == ["registry.example.com/ml/train:2"] * 2
    rendered = torchstep.kubernetes.render_app(
        torchstep.materialize(f"{comp}:app"), namespace="default", cfg={"run_id": "r"}
    )
    check(rendered)  # strict schema validation of what the warning did not change
    assert torchstep_main(["render", f"{comp}:app", "--image", " "]) == 2
    assert "--image" in capsys.readouterr().err


def test_render_refuses_a_local_directory_as_the_image(capsys, tmp_path):
    comp = tmp_path / "comp.py"
    comp.write_text(
        "from torchx import specs\n"
        "def app(image: str = '.') -> specs.AppDef:\n"
        "    return specs.AppDef('a', [specs.Role('t', image, entrypoint='python')])\n"
    )
    assert torchstep_main(["render", f"{comp}:app"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "roles[0].image (target 'kubernetes'): '.' is a path on this machine" in err
    assert "fix: build an image with your code" in err
    assert torchstep_main(["render", f"{comp}:app", "--image", "ghcr.io/acme/app:1"]) == 0


def test_runopts(capsys):
    opts = cfg_table()
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
