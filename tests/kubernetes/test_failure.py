"""The retry / exit-code mapping: what the Job controller does with each way a pod can end,
per retry policy. The rules are evaluated the way Kubernetes' job controller does
(pkg/controller/job/pod_failure_policy.go: first matching rule wins; an onExitCodes rule
looks at terminated containers with a non-zero exit code, of the named container only)."""

from __future__ import annotations

import pytest
import torchstep
from torchstep.kubernetes import CONTAINER_NAME, FailureKind, classify_exit, render_plan
from torchx import specs

# (exit code, DisruptionTarget condition) → what it means
CASES = {
    "worker failed, budget spent": (1, False),
    "worker exit 127": (127, False),
    "worker killed by SIGSEGV": (139, False),
    "worker killed by SIGKILL (= agent SIGKILLed)": (137, False),
    "non-retryable": (82, False),
    "non-retryable while evicted": (82, True),
    "agent error": (83, False),
    "agent SIGTERMed (pod deleted)": (143, False),
    "evicted / preempted / node drained": (143, True),
    "node gone, agent SIGKILLed": (137, True),
    "OOM-killed container": (137, False),
}


def match_policy(policy: dict, exit_code: int, disrupted: bool, container: str = CONTAINER_NAME) -> str:
    """The action Kubernetes takes for a failed pod: the first matching rule, else Count."""
    for rule in policy["rules"]:
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            if req.get("containerName", container) != container or exit_code == 0:
                continue
            if (exit_code in req["values"]) == (req["operator"] == "In"):
                return rule["action"]
        elif any(c["type"] == "DisruptionTarget" and c["status"] == "True" for c in rule["onPodConditions"]):
            if disrupted:
                return rule["action"]
    return "Count"


def job_spec(role, policy, retries: int, replicas: int = 4) -> dict:
    app = specs.AppDef("a", [role(num_replicas=replicas, max_retries=retries, retry_policy=policy)])
    return render_plan(torchstep.build_plan(app, "kubernetes"), run_id="r").roles[0].workload["spec"]


@pytest.mark.parametrize("case", list(CASES))
def test_replica_policy_replaces_only_lost_pods(role, case):
    exit_code, disrupted = CASES[case]
    spec = job_spec(role, specs.RetryPolicy.REPLICA, 3)
    action = match_policy(spec["podFailurePolicy"], exit_code, disrupted)
    kind = classify_exit(exit_code, disrupted=disrupted)
    # the agent's own final answer fails the Job at once; a preempted pod is replaced uncounted
    # (its own budget); anything else replaces the pod, counted against backoffLimitPerIndex (3);
    # maxFailedIndexes 0 ends the Job when an index runs out
    expected = {FailureKind.FAILED: "FailJob", FailureKind.NON_RETRYABLE: "FailJob", FailureKind.PREEMPTED: "Ignore"}
    expected = expected.get(kind, "Count")
    assert action == expected, (case, kind)
    assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (3, 0)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("policy", [specs.RetryPolicy.APPLICATION, "ROLE"])
def test_other_policies_fail_fast_on_non_retryable(role, policy, case):
    exit_code, disrupted = CASES[case]
    spec = job_spec(role, policy, 2)
    action = match_policy(spec["podFailurePolicy"], exit_code, disrupted)
    assert action == ("FailJob" if exit_code == 82 else "Ignore" if disrupted else "Count")
    # APPLICATION: backoffLimit 0, the first counted failure fails the Job (the orchestrator retries);
    # ROLE: the Job retries the role, N per replica
    assert spec["backoffLimit"] == (0 if policy == specs.RetryPolicy.APPLICATION else 2 * 4)


def test_sidecar_exit_codes_never_match(role):
    spec = job_spec(role, specs.RetryPolicy.REPLICA, 1)
    assert match_policy(spec["podFailurePolicy"], 1, False, container="log-shipper") == "Count"


@pytest.mark.parametrize(
    ("code", "disrupted", "kind"),
    [
        (0, False, FailureKind.SUCCEEDED),
        (1, False, FailureKind.FAILED),
        (130, False, FailureKind.FAILED),
        (82, False, FailureKind.NON_RETRYABLE),
        (82, True, FailureKind.NON_RETRYABLE),
        (83, False, FailureKind.AGENT_ERROR),
        (137, False, FailureKind.LOST),
        (143, False, FailureKind.STOPPED),
        (143, True, FailureKind.PREEMPTED),
        (1, True, FailureKind.PREEMPTED),
        (None, False, FailureKind.LOST),
    ],
)
def test_classify_exit(code, disrupted, kind):
    assert classify_exit(code, disrupted=disrupted) is kind


def test_exit_codes_match_the_shared_contract():
    assert (torchstep.NON_RETRYABLE_EXIT_CODE, torchstep.AGENT_ERROR_EXIT_CODE) == (82, 83)
