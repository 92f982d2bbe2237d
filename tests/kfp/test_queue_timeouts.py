"""How the KFP launcher step's timeout counts the time its Jobs wait in a Kueue queue
(issue 36 goal 4; docs/kubernetes.md, "Timeouts and the queue"): the launcher pod waits while
its Jobs are queued, so a timeout on it (``activeDeadlineSeconds``) would count the wait; with
the run option ``queue`` it gets none, and the step timeout stays on the Jobs, which
Kubernetes counts from admission."""

# No `from __future__ import annotations`: KFP reads the pipeline functions' annotations as types.
from pathlib import Path
from typing import Any

import pytest
import torchstep
import yaml
from torchx import specs

pytest.importorskip("kfp")
pytest.importorskip("kfp.kubernetes")
from kfp import compiler, dsl  # noqa: E402
from torchstep_kfp import component_from_app  # noqa: E402


def gang(timeout_s: int) -> specs.AppDef:
    role = specs.Role(
        "trainer", image="ghcr.io/acme/train:1", entrypoint="python", args=["-m", "train"], num_replicas=2
    )
    return specs.AppDef("train", roles=[role], metadata={"torchstep.timeout": str(timeout_s)})


def launcher_deadline(tmp_path: Path, cfg: dict[str, Any]) -> str | None:
    op = component_from_app(gang(3600), cfg=cfg)

    @dsl.pipeline
    def pipeline():
        op()

    out = tmp_path / "p.yaml"
    compiler.Compiler().compile(pipeline, str(out))
    _, platform = yaml.safe_load_all(out.read_text())
    (executor,) = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values()
    return executor.get("activeDeadlineSeconds")


def test_a_queued_launcher_gets_no_timeout_and_its_jobs_keep_the_step_timeout(tmp_path: Path) -> None:
    assert launcher_deadline(tmp_path, {"namespace": "ml"}) == "3600"  # not queued: the launcher is bounded
    assert launcher_deadline(tmp_path, {"namespace": "ml", "queue": "team-a"}) is None
    # the Jobs the queued launcher submits carry the step timeout, counted from admission
    rendered = torchstep.kubernetes.render_app(gang(3600), namespace="ml", cfg={"queue": "team-a", "run_id": "r1"})
    job = rendered.roles[0].workload
    assert job["spec"]["suspend"] is True and job["spec"]["activeDeadlineSeconds"] == 3600
