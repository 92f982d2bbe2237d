"""What the Airflow operator hands Airflow from a step a worker controls (issue 33, items 4
and 5): a NaN output never makes a successful step fail when its XCom is pushed (Airflow's
API client refuses non-finite JSON numbers), and the exception that fails a task is one
bounded line with a worker's terminal escapes shown, never obeyed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException
from torchstep.result import RankResult, ReplicaResult, StepResult
from torchstep.untrusted import MAX_TAIL_LINE_BYTES
from torchstep_airflow import AppDefOperator
from torchx import specs


class TaskInstance:
    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


def operator() -> AppDefOperator:
    with DAG("d", schedule=None):
        return AppDefOperator(
            task_id="t", app=specs.AppDef("demo", roles=[specs.Role("w", image="", entrypoint="echo")])
        )


def test_a_nan_output_is_an_xcom_airflow_accepts() -> None:
    from airflow.sdk.serde import serialize

    result = StepResult("demo-1", "SUCCEEDED", 0, outputs={"acc": float("nan"), "loss": float("-inf")})
    data = operator().finish(result, {"ti": TaskInstance()})
    json.dumps(serialize(data), allow_nan=False)  # raised "Out of range float values are not JSON compliant"
    assert data["outputs"] == {"acc": "NaN", "loss": "-Infinity"}
    assert any("acc: NaN is not a JSON number" in w for w in data["warnings"])


def test_the_failure_is_one_bounded_line_with_escapes_shown() -> None:
    line = "ValueError: \x1b[2J\x1b]0;owned\x07" + "x" * 200_000
    rc = RankResult("w", 0, 0, "FAILED", 1, replica_id=0, message="exited with code 1", tail=[line])
    result = StepResult("demo-1", "FAILED", 1, root_cause=rc, replicas=[ReplicaResult("w", 0, "FAILED", 1, ranks=[rc])])
    ti = TaskInstance()
    with pytest.raises(AirflowException) as err:
        operator().finish(result, {"ti": ti})
    text = str(err.value)
    assert "\x1b" not in text and "\x07" not in text and "ValueError: \\x1b[2J\\x1b]0;owned\\x07" in text
    assert "\n" not in text and len(text) < MAX_TAIL_LINE_BYTES + 400, len(text)
    json.dumps(ti.pushed["return_value"], allow_nan=False)


@pytest.mark.parametrize("written", [[1, 2], {"schema": 1, "state": "FAILED"}, "x"], ids=["list", "no-app-id", "str"])
def test_a_step_result_the_pod_wrote_that_is_not_one_is_a_warning_never_a_crash(written: Any) -> None:
    """KubernetesPodOperator's XCom sidecar hands back what the pod wrote to return.json."""
    from types import SimpleNamespace as ns

    pytest.importorskip("airflow.providers.cncf.kubernetes")  # the 1-pod path needs the provider
    from torchstep_airflow.kubernetes import _from_pod

    pod = ns(status=ns(container_statuses=[ns(name="main", state=ns(terminated=ns(exit_code=3, message=None)))]))
    op = ns(step_result=written, final_pod=pod)
    rendered = ns(app_id="demo-1", namespace="ml", roles=[ns(name="demo-1")])
    result = _from_pod(op, rendered, lambda: None, log=None)  # type: ignore[arg-type]
    assert (result.state, result.exit_code) == ("FAILED", 3)
    assert result.warnings and result.warnings[0].startswith("the pod's step result was refused: "), result.warnings
