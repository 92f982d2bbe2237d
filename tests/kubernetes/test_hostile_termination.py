"""Termination messages a pod writes, as a stranger would write them (issue 33, item 3):
the watcher's collect never raises on one, keeps the container's real exit code, and says
in the result's warnings what it refused; control characters in a message that is not a
summary never reach a failure line."""

from __future__ import annotations

import json
from types import SimpleNamespace as ns
from typing import Any

import pytest
import torchstep
from torchstep.kubernetes.collect import COMPLETION_INDEX, collect
from torchstep.result import SUMMARY_KEY
from torchstep.steps import failure_summary
from torchx import specs


def rendered() -> Any:
    role = specs.Role("w", image="i", entrypoint="python", args=["-m", "w"], num_replicas=2)
    return torchstep.kubernetes.render_app(specs.AppDef("a", roles=[role]), cfg={"run_id": "r"})


def pod(code: int, message: str | None) -> Any:
    labels = dict(rendered().roles[0].workload["spec"]["template"]["metadata"]["labels"])
    term = ns(exit_code=code, message=message, finished_at="2026-11-24T00:00:09Z")
    return ns(
        metadata=ns(
            name="p", labels=labels, annotations={COMPLETION_INDEX: "0"}, creation_timestamp="2026-11-24T00:00:05Z"
        ),
        status=ns(phase="Failed", conditions=[], container_statuses=[ns(name="main", state=ns(terminated=term))]),
    )


def summary(**over: Any) -> str:
    data = {
        SUMMARY_KEY: 1,
        "app_id": "a-r",
        "state": "FAILED",
        "exit_code": 3,
        "retryable": True,
        "restarts": 0,
        "duration_s": 1.0,
        "message": "w/0 failed",
        "root_cause": None,
        "outputs": {},
        "warnings": [],
    }
    data.update(over)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("message", "refused"),
    [
        (summary()[:-1] + ', "outputs": ' + "[" * 2000 + "]" * 2000 + "}", "nested deeper than 64 levels"),
        (summary(restarts="x"), "result summary.restarts: refused str 'x'; expected int"),
        (summary().replace('"duration_s": 1.0', '"duration_s": 1e999'), "result summary.duration_s: refused"),
        (summary(root_cause="x"), "result summary.root_cause: refused str; expected an object"),
        (summary(root_cause={"role": ["w"], "rank": "0"}), "result summary.root_cause"),
        (summary(outputs=[1, 2]), "result summary.outputs: refused list [1, 2]; expected dict[str, Any]"),
        (summary(exit_code=10**400), "result summary.exit_code"),
        (summary(state={"x": 1}), "result summary.state: refused dict"),
    ],
    ids=[
        "nested-2000",
        "restarts-x",
        "overflow",
        "root-cause-str",
        "root-cause-types",
        "outputs-list",
        "huge-int",
        "state-dict",
    ],
)
def test_a_malformed_termination_message_is_a_warning_never_a_crash(message: str, refused: str) -> None:
    result = collect(rendered(), [pod(3, message)], "FAILED", 0.0)
    assert result.state == "FAILED" and result.exit_code == 3  # the container's own exit code survives
    assert any(refused in w for w in result.warnings), result.warnings
    assert isinstance(result.outputs, dict)
    json.dumps(result.to_dict(), allow_nan=False)
    assert failure_summary(result)


def test_a_valid_part_of_a_partly_malformed_summary_is_kept() -> None:
    rc = {
        "role": "w",
        "rank": 1,
        "local_rank": 1,
        "replica_id": 0,
        "state": "FAILED",
        "exit_code": 3,
        "line": "ValueError: bad lr",
    }
    result = collect(rendered(), [pod(3, summary(restarts="x", root_cause=rc, outputs={"acc": 0.5}))], "FAILED", 0.0)
    assert result.root_cause is not None and result.root_cause.rank == 1
    assert "ValueError: bad lr" in failure_summary(result)
    assert result.outputs == {"acc": 0.5}


def test_escapes_in_a_plain_termination_message_never_reach_the_failure_line() -> None:
    result = collect(rendered(), [pod(1, "Error: \x1b[2J\x1b]0;owned\x07 boom\n")], "FAILED", 0.0)
    text = failure_summary(result)
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text, text
