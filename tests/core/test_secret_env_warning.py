"""A plain ``env`` value whose name looks like a secret (issue 24): ``explain`` and every
place that writes it by value (rendered Kubernetes objects, a compiled KFP pipeline,
Airflow's rendered fields) say so once per step, with the fix — and never repeat the value."""

from __future__ import annotations

import subprocess
import sys
import uuid
import warnings

import pytest
import torchstep
from torchstep.plan.secrets import InlinedSecretWarning, looks_like_secret
from torchx import specs

VALUE = "hf_live_value_0123456789"


def app(env: dict[str, str], **md) -> specs.AppDef:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1",
        entrypoint="python",
        args=["-m", "train"],
        env=env,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
        metadata=md,
    )
    return specs.AppDef(f"app-{uuid.uuid4().hex[:6]}", roles=[role])  # a step of its own: warned once


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("hf_token", True),
        ("GITHUB_TOKEN_RO", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("DB_PASSWORD", True),
        ("WANDB_API_KEY", True),
        ("KEY", False),
        ("MONKEY", False),
        ("LOGLEVEL", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("PATH", False),
    ],
)
def test_which_names_look_like_secrets(name, secret):
    assert looks_like_secret(name) is secret


@pytest.mark.parametrize("target", ["local", "kubernetes", "kfp"])
def test_explain_says_it_with_the_fix_and_without_the_value(target):
    text = torchstep.explain(app({"HF_TOKEN": VALUE, "DB_PASSWORD": VALUE, "LOGLEVEL": "INFO"}), target)
    (line,) = [x for x in text.splitlines() if x.startswith("warning:")]
    assert "roles[0].env['HF_TOKEN'], roles[0].env['DB_PASSWORD'] look like secrets" in line
    assert "fix: role.metadata['torchstep']['secret_env'] = {'HF_TOKEN': '<secret-name>/<key>'}" in line
    assert VALUE not in text and "LOGLEVEL'" not in line


def test_explain_is_quiet_for_secrets_by_reference_and_empty_values():
    ok = app({"HF_TOKEN": ""}, torchstep={"secret_env": {"WANDB_API_KEY": "wandb/key"}})
    assert "warning:" not in torchstep.explain(ok, "kubernetes")


def test_rendering_warns_once_per_step():
    a = app({"HF_TOKEN": VALUE})
    with pytest.warns(InlinedSecretWarning) as caught:
        objs = torchstep.kubernetes.render(a, cfg={"run_id": "r1"})
        torchstep.kubernetes.render(a, cfg={"run_id": "r2"})  # another try of the same step: said already
    assert len(caught) == 1 and VALUE not in str(caught[0].message)
    assert "the rendered Kubernetes objects" in str(caught[0].message)
    assert VALUE in str(objs)  # what the warning is about: the value is in the object
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torchstep.kubernetes.render(app({"LOGLEVEL": "INFO"}), cfg={"run_id": "r3"})  # nothing to say


def test_the_cli_explain_prints_it():
    def explain(*env: str) -> str:
        argv = [
            sys.executable,
            "-m",
            "torchstep.cli",
            "explain",
            "dist.ddp",
            "--target",
            "kubernetes",
            "--",
            *env,
            "-j",
            "1x1",
            "--script",
            "train.py",
        ]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    text = explain("--env", f"HF_TOKEN={VALUE}")
    assert "warning: roles[0].env['HF_TOKEN'] looks like a secret" in text and VALUE not in text
    assert "warning:" not in explain("--env", "LOGLEVEL=INFO")
