"""TorchX ``dist.ddp`` command lines run unchanged under the agent: through the torchrun
shim first on PATH, and with ``torchrun`` replaced by ``torchstep-agent``."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from agent_testlib import WORKER, Agents
from torchstep.agent import shims_dir
from torchx.components.dist import ddp
from torchx.specs import macros


def _ddp_role():
    app = ddp("--mode", "env", script=WORKER, j="1x2", name="ddp-test")
    role = macros.Values(img_root="", app_id="ddp-test-1", replica_id="0", rank0_env="TORCHX_RANK0_HOST").apply(
        app.roles[0]
    )
    assert role.entrypoint == "bash" and role.args[0] == "-c" and role.args[1].startswith("torchrun ")
    return role


def _check(agent, role) -> None:
    assert agent.wait(120) == 0, agent.diagnostics()
    r = agent.result
    assert r["state"] == "SUCCEEDED" and r["outputs"]["metrics"]["world"] == 2
    assert r["replicas"][0]["role"] == role.name
    ranks = r["replicas"][0]["ranks"]
    assert [k["rank"] for k in ranks] == [0, 1]
    env = json.loads(next(x for x in open(ranks[1]["log_file"]) if x.startswith("ENV "))[4:])
    assert env["WORLD_SIZE"] == "2" and env["RANK"] == "1"
    # run directly (no torchstep launcher): torchrun's console for dist.ddp's --tee 3
    assert f"[{role.name}1]:stderr line of rank 1" in agent.stderr


def test_ddp_command_line_through_the_torchrun_shim(agents: Agents) -> None:
    role = _ddp_role()
    env = {
        **role.env,
        "PATH": f"{shims_dir()}:/usr/bin:/bin",
        "TORCHSTEP_PYTHON": sys.executable,
        "TORCHSTEP_ROLE": role.name,
    }
    a = agents.start_command([role.entrypoint, *role.args], env=env, name="shim")
    _check(a, role)


def test_ddp_command_line_with_torchstep_agent_instead_of_torchrun(agents: Agents) -> None:
    role = _ddp_role()
    agent_bin = Path(sys.executable).parent / "torchstep-agent"
    if not agent_bin.exists():
        pytest.skip("the torchstep-agent console script is not installed next to this python")
    cmd = shlex.quote(str(agent_bin)) + role.args[1][len("torchrun") :]
    a = agents.start_command([role.entrypoint, "-c", cmd], env={**role.env, "TORCHSTEP_ROLE": role.name}, name="agent")
    _check(a, role)
