"""A secret's value never appears in anything rendered: objects, YAML, JSON, reprs, CLI
output — even when the value is present in the rendering process's environment."""

from __future__ import annotations

import json

import torchstep
import yaml
from torchstep.kubernetes import render_plan
from torchstep.kubernetes.cli import main
from torchx import specs

VALUE = "hf_s3cr3t-VALUE-0123456789"
OTHER = "wandb-TOPSECRET-9876"


def test_secret_values_never_rendered(role, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HF_TOKEN", VALUE)
    monkeypatch.setenv("WANDB_API_KEY", OTHER)
    secret_env = {"HF_TOKEN": "hf-token/token", "WANDB_API_KEY": "wandb/api-key"}
    roles = [
        role(name="trainer", num_replicas=2, metadata={"torchstep": {"secret_env": secret_env}}),
        role(name="eval", metadata={"torchstep": {"secret_env": {"HF_TOKEN": "hf-token/token"}}}),
    ]
    app = specs.AppDef("train", roles)
    plan = torchstep.build_plan(app, "kubernetes")
    rendered = render_plan(plan, run_id="r", cfg={"pod": True})
    texts = [
        repr(rendered),
        str(rendered),
        repr(plan),
        json.dumps(rendered.objects),
        yaml.safe_dump_all(rendered.objects),
        *(repr(r) + json.dumps(r.template) for r in rendered.roles),
        json.dumps(rendered.roles[1].pod),
    ]
    (tmp_path / "app.py").write_text(
        "from torchx import specs\n"
        "def app() -> specs.AppDef:\n"
        f"    return specs.AppDef('train', [specs.Role('t', 'img:1', entrypoint='python', args=['x.py'],"
        f" num_replicas=2, metadata={{'torchstep': {{'secret_env': {secret_env!r}}}}})])\n"
    )
    assert main([f"{tmp_path / 'app.py'}:app", "--run-id", "r"]) == 0
    texts.append(capsys.readouterr().out)
    for text in texts:
        assert VALUE not in text and OTHER not in text
    # the references are there
    env = rendered.roles[0].workload["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {
        "HF_TOKEN": {"name": "hf-token", "key": "token"},
        "WANDB_API_KEY": {"name": "wandb", "key": "api-key"},
    }
    assert "secretKeyRef" in texts[-1]
