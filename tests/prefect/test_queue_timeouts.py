"""How Prefect's ``timeout_seconds`` counts the time a kubernetes step waits in a Kueue queue
(issue 36 goal 4; docs/kubernetes.md, "Timeouts and the queue"): torchstep never derives it
from the step timeout (the Jobs' ``activeDeadlineSeconds`` carries that, counted from
admission); one the flow author sets counts wall time, the wait in the queue included."""

from __future__ import annotations

import pytest
from torchx import specs

pytest.importorskip("prefect")
from torchstep_prefect import app_task  # noqa: E402


def test_a_queued_step_has_no_prefect_timeout_unless_the_author_sets_one() -> None:
    role = specs.Role("t", image="ghcr.io/acme/train:1", entrypoint="python", args=["-m", "t"], num_replicas=2)
    app = specs.AppDef("train", roles=[role], metadata={"torchstep.timeout": "600"})
    cfg = {"namespace": "ml", "queue": "team-a"}
    assert app_task(app, target="kubernetes", cfg=cfg).timeout_seconds is None
    assert app_task(app, target="kubernetes", cfg=cfg, timeout_seconds=3600).timeout_seconds == 3600
