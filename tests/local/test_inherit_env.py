"""``inherit_env=False`` (issue 24): a step run for someone else (the generic DAG and flow)
gets only a short allowlist of this process's environment plus the AppDef's own env — the
caller's secrets reach no process of the run, no output line, no log file and no result."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import torchstep
from local_testlib import HERE, TOKEN_ENV
from torchx import specs

PROBE = str(HERE / "scripts" / "env_probe.py")
SECRET = "s3cr3t-caller-credential-7f1e"


def app(token: str, *, replicas: int = 2, nproc: int = 2) -> specs.AppDef:
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    env = {"STEP_OWN": "from-the-appdef", TOKEN_ENV: token}  # the leak check follows the AppDef's env
    probe = specs.Role(
        "probe",
        image="unused",
        entrypoint="python",
        args=[PROBE, digest],
        num_replicas=replicas,
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
        env=env,
        metadata={"torchstep": {"nproc_per_node": nproc}},
    )
    shell = specs.Role(
        "shell",
        image="unused",
        entrypoint="sh",
        args=["-c", "env; cat /proc/self/environ; echo"],
        resource=specs.Resource(cpu=-1, gpu=0, memMB=-1),
        env=env,
    )
    return specs.AppDef("envprobe", roles=[probe, shell])


@pytest.fixture
def caller_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's environment: credentials beside what every program needs."""
    for name in ("AWS_SECRET_ACCESS_KEY", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "GITHUB_TOKEN", "lowercase_secret"):
        monkeypatch.setenv(name, SECRET)
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("LC_ALL", "C.UTF-8")
    monkeypatch.setenv("TZ", "UTC")


def everything_written(log_dir: Path) -> bytes:
    return b"".join(p.read_bytes() for p in log_dir.rglob("*") if p.is_file())


@pytest.mark.parametrize("zygote", ["0", "1"])
def test_the_callers_secrets_are_nowhere_in_the_run(caller_env, monkeypatch, no_leftovers, tmp_path, capfd, zygote):
    monkeypatch.setenv("TORCHSTEP_ZYGOTE", zygote)  # workers forked from the agent's zygote, or exec'd
    log_dir = tmp_path / "logs"
    result = torchstep.run_local(app(no_leftovers), cfg={"inherit_env": False, "log_dir": str(log_dir)})
    out, err = capfd.readouterr()
    assert result.state == "SUCCEEDED", out[-3000:] + err[-3000:]

    data = json.dumps(result.to_dict())
    assert SECRET not in data
    assert SECRET.encode() not in everything_written(log_dir)
    assert SECRET not in out and SECRET not in err
    # every process of the run looked at every other one (agents, zygote, store, workers)
    assert result.outputs["leaks"] == [] and result.outputs["run_processes"] >= 4, result.outputs
    names = set(result.outputs["env"])
    assert not {"AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "lowercase_secret", "PYTHONPATH"} & names
    assert {"PATH", "HOME", "LANG", "LC_ALL", "TZ", "STEP_OWN"} <= names
    for line in ("STEP_OWN=from-the-appdef", "LANG=C.UTF-8", "LC_ALL=C.UTF-8", "TZ=UTC"):
        assert line in out
    # the zygote switch survives (it is no secret): with it on, the Python workers were forked from it
    assert out.count("preloaded=True") == (4 if zygote == "1" else 0), out[-3000:]


def test_by_default_the_step_inherits_the_environment_and_the_probe_sees_it(caller_env, no_leftovers, tmp_path, capfd):
    """The control: the same probe does see the secret when the step inherits the environment
    (``torchstep run``, ``run_local`` and the operators keep today's behaviour)."""
    result = torchstep.run_local(app(no_leftovers, replicas=1, nproc=1), cfg={"log_dir": str(tmp_path / "logs")})
    out, _ = capfd.readouterr()
    assert result.state == "SUCCEEDED"
    assert result.outputs["leaks"] and "AWS_SECRET_ACCESS_KEY" in result.outputs["env"]
    assert SECRET in out  # the shell role printed it: inheriting is what the option turns off


def test_secret_env_reads_nothing_from_the_caller_without_inheritance(caller_env, tmp_path):
    role = specs.Role(
        "w", image="unused", entrypoint="true", metadata={"torchstep": {"secret_env": {"GITHUB_TOKEN": "gh/token"}}}
    )
    with pytest.raises(torchstep.SpecError, match=r"secret_env.*inherit_env=False.*fix: run on the kubernetes"):
        torchstep.run_local(specs.AppDef("s", roles=[role]), cfg={"inherit_env": False, "log_dir": str(tmp_path)})
    assert not list(tmp_path.iterdir())  # refused before anything was created


def test_inherit_env_is_a_bool_option():
    from torchstep.local import cfg_table, resolve

    assert resolve({}).inherit_env is True and resolve({"inherit_env": "false"}).inherit_env is False
    assert "inherit_env" in str(cfg_table())
    with pytest.raises(torchstep.SpecError, match=r"cfg\['inherit_env'\].*must be a bool"):
        resolve({"inherit_env": "sometimes"})


def test_torchstep_itself_stays_importable_when_only_pythonpath_finds_it(tmp_path):
    from torchstep.local.prepare import base_env

    src = str(Path(torchstep.__file__).resolve().parents[1])
    env = base_env({"PYTHONPATH": os.pathsep.join(["/elsewhere", src]), "SECRET": "x"}, inherit=False)
    assert env == {"PYTHONPATH": src}
    assert sys.executable  # the agent runs with this interpreter: nothing else of PYTHONPATH is needed
