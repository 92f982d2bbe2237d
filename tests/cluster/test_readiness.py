"""Readiness on the one-machine cluster: the kubelet runs a container's exec readinessProbe
inside the pod (its private ``/tmp``, its PID namespace) and the pod's ``Ready`` condition,
``containerStatuses[].ready`` and the Job's ``status.ready`` follow it (issue 36, goal 4:
what Kueue's ``waitForPodsReady`` reads)."""

from __future__ import annotations

from typing import Any

from cluster.harness import Cluster


def condition(pod: dict[str, Any], kind: str) -> str | None:
    return next((c["status"] for c in pod["status"].get("conditions") or [] if c["type"] == kind), None)


def test_a_pod_is_ready_only_while_its_probe_passes_inside_the_pod(real_cluster: Cluster) -> None:
    # the file lives in the pod's private /tmp: a probe run outside the pod could not see it
    script = "sleep 3; touch /tmp/ready; sleep 4; rm /tmp/ready; sleep 60"
    probe = {
        "exec": {"command": ["test", "-f", "/tmp/ready"]},
        "periodSeconds": 1,
        "timeoutSeconds": 5,
        "failureThreshold": 2,
    }
    made = real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probed"},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "containers": [
                    {"name": "main", "image": "onemachine", "command": ["sh", "-c", script], "readinessProbe": probe}
                ],
            },
        }
    )
    assert made.get("kind") == "Pod", made
    running = real_cluster.wait(
        lambda: (p := real_cluster.get("pods", "probed"))["status"].get("phase") == "Running" and p,
        60,
        "the pod to run",
    )
    # running, not ready: the probe has not passed yet
    assert condition(running, "Ready") == "False" and condition(running, "ContainersReady") == "False"
    assert running["status"]["containerStatuses"][0]["ready"] is False
    ready = real_cluster.wait(
        lambda: condition(p := real_cluster.get("pods", "probed"), "Ready") == "True" and p, 30, "the probe to pass"
    )
    assert ready["status"]["containerStatuses"][0]["ready"] is True
    # the file removed: unready again after failureThreshold failures; the container still runs
    unready = real_cluster.wait(
        lambda: condition(p := real_cluster.get("pods", "probed"), "Ready") == "False" and p,
        30,
        "the pod to turn unready",
    )
    assert unready["status"]["phase"] == "Running" and unready["status"]["containerStatuses"][0]["ready"] is False
    reasons = {c["type"]: c.get("reason") for c in unready["status"]["conditions"]}
    assert reasons["Ready"] == "ContainersNotReady"
    real_cluster.delete("pods", "probed")


def test_a_job_counts_as_ready_only_its_pods_whose_probe_passes(real_cluster: Cluster) -> None:
    # index 0 becomes ready, index 1 never does (its probe names a file it never writes)
    script = "touch /tmp/ready-$(JOB_COMPLETION_INDEX); sleep 60"
    probe = {"exec": {"command": ["sh", "-c", "test -f /tmp/ready-0"]}, "periodSeconds": 1, "timeoutSeconds": 5}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gang"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 2,
            "parallelism": 2,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [
                        {
                            "name": "main",
                            "image": "onemachine",
                            "command": ["sh", "-c", script],
                            "readinessProbe": probe,
                            "env": [
                                {
                                    "name": "JOB_COMPLETION_INDEX",
                                    "valueFrom": {
                                        "fieldRef": {
                                            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                                        }
                                    },
                                }
                            ],
                        }
                    ],
                }
            },
        },
    }
    assert real_cluster.create(job).get("kind") == "Job"
    status = real_cluster.wait(
        lambda: (j := real_cluster.get("jobs", "gang"))["status"].get("ready") == 1 and j["status"],
        60,
        "one pod of the Job to be ready",
    )
    assert status["active"] == 2
    pods = real_cluster.items("pods", "job-name=gang")
    assert sorted(condition(p, "Ready") or "" for p in pods) == ["False", "True"]
    assert all(p["status"]["phase"] == "Running" for p in pods)
    real_cluster.delete("jobs", "gang", propagationPolicy="Foreground")
