"""The readinessProbe of a multi-replica role's pods (Kueue's ``waitForPodsReady`` reads the
pods' readiness): it checks the agent's readiness file, with the image's python, and it
really answers — exit 0 while the file exists, 1 otherwise."""

from __future__ import annotations

import doctest
import subprocess
import sys
from pathlib import Path

import pytest
import torchstep
from torchstep.kubernetes import readiness
from torchx import specs


def app(replicas: int, **role: object) -> specs.AppDef:
    return specs.AppDef(
        "t", roles=[specs.Role("w", image="img", entrypoint="python", args=["t.py"], num_replicas=replicas, **role)]
    )  # type: ignore[arg-type]


def container(a: specs.AppDef, **cfg: object) -> dict:
    objs = torchstep.kubernetes.render(a, namespace="ml", cfg={"run_id": "r1", **cfg})
    workload = objs[-1]
    spec = workload["spec"]["template"]["spec"] if workload["kind"] == "Job" else workload["spec"]
    return dict(spec["containers"][0])


def env_of(c: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c["env"]}


def test_a_multi_replica_pod_probes_the_agents_ready_file() -> None:
    c = container(app(2))
    path = env_of(c)["TORCHSTEP_READY_FILE"]
    assert path == "/dev/shm/torchstep-ready"  # the pod's own memory emptyDir: writable under a read-only root
    probe = c["readinessProbe"]
    assert probe["exec"]["command"][0] == "python" and probe["exec"]["command"][-1] == path
    assert (probe["periodSeconds"], probe["timeoutSeconds"], probe["failureThreshold"]) == (2, 5, 3)


def test_the_probe_command_passes_only_while_the_file_exists(tmp_path: Path) -> None:
    command = readiness.readiness_probe(str(tmp_path / "ready"))["exec"]["command"]
    run = [sys.executable, *command[1:]]  # the image's python, here this one
    assert subprocess.run(run, check=False).returncode == 1
    (tmp_path / "ready").write_text("1\n")
    assert subprocess.run(run, check=False).returncode == 0


def test_one_replica_has_no_probe_and_no_ready_file() -> None:
    c = container(app(1))
    assert "readinessProbe" not in c and "TORCHSTEP_READY_FILE" not in env_of(c)


def test_a_mount_over_dev_shm_moves_the_ready_file_to_tmp(tmp_path: Path) -> None:
    shared = specs.BindMount(src_path=str(tmp_path), dst_path="/dev/shm")
    c = container(app(2, mounts=[shared]))
    assert env_of(c)["TORCHSTEP_READY_FILE"] == "/tmp/torchstep-ready"
    assert c["readinessProbe"]["exec"]["command"][-1] == "/tmp/torchstep-ready"


def test_a_probe_in_the_overlay_is_kept_instead_of_ours() -> None:
    mine = {"exec": {"command": ["cat", "/ready"]}, "periodSeconds": 7}
    overlay = {"spec": {"containers": [{"name": "main", "readinessProbe": mine}]}}
    c = container(app(2, metadata={"kubernetes": overlay}))
    assert c["readinessProbe"] == mine
    assert env_of(c)["TORCHSTEP_READY_FILE"] == "/dev/shm/torchstep-ready"  # the agent still writes it


@pytest.mark.parametrize("module", ["torchstep.kubernetes.readiness", "torchstep.agent.readiness"])
def test_docstring_examples(module: str) -> None:
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
