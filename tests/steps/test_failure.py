"""torchstep.steps.failure: the one line adapters log and raise with."""

from __future__ import annotations

from torchstep.result import RankResult, StepResult
from torchstep.steps.failure import failure_summary


def test_failure_summary_names_state_exit_code_and_message() -> None:
    text = failure_summary(StepResult("train-1", "FAILED", 3, message="trainer replica 1 exited 3"))
    assert text == "train-1 FAILED (exit code 3); trainer replica 1 exited 3"
    assert failure_summary(StepResult("train-1", "CANCELLED", None)) == "train-1 CANCELLED"


def test_failure_summary_names_the_root_cause_by_its_last_meaningful_line() -> None:
    tail = [
        "step 1",
        "Traceback (most recent call last):",
        '  File "t.py", line 3, in <module>',
        "    boom()",
        "KeyError: 'lr'",
        "[rank0]:[W1125 11:53:21.620 ProcessGroupGloo.cpp:123] destroy_process_group() was not called",
    ]
    root = RankResult(
        "trainer", 1, 1, "FAILED", 3, message="exited with code 3", reason="worker_failed", replica_id=0, tail=tail
    )
    text = failure_summary(StepResult("train-1", "FAILED", 3, root_cause=root, message="rank 1 failed"))
    assert text == "train-1 FAILED (exit code 3); root cause: rank 1 (trainer replica 0): KeyError: 'lr'"
    root.tail = ["loading", "python: can't open file '/w/missing.py': [Errno 2] No such file or directory", ""]
    assert failure_summary(StepResult("train-1", "FAILED", 2, root_cause=root)).endswith(
        "root cause: rank 1 (trainer replica 0): python: can't open file '/w/missing.py': [Errno 2] No such file or "
        "directory"
    )
    root.reason, root.message = "timer_expired", "timer 'step' expired (torchstep.expires / timer.expires)"
    assert failure_summary(StepResult("train-1", "FAILED", 137, root_cause=root)).endswith(
        "rank 1 (trainer replica 0): timer 'step' expired (torchstep.expires / timer.expires)"
    )  # what the agent saw says more than the last log line


def test_a_message_from_a_pod_is_one_escaped_line() -> None:
    text = failure_summary(StepResult("x", "FAILED", 1, message="line one\nline two\x1b[31m"))
    assert "\n" not in text and "\x1b" not in text and text.startswith("x FAILED (exit code 1); line one")
