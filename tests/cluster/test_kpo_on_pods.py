"""Airflow's KubernetesPodOperator path on real pods (issue 35 item 2, issue 36 goal 3): a
1-role, 1-replica ``AppDefOperator(target="kubernetes")`` in ``dag.test()`` runs as
``StepPodOperator`` against the one-machine cluster, the provider's code unchanged: the pod
(the agent and the operator's XCom sidecar, two containers) runs, the agent writes the step
result into the shared ``/airflow/xcom`` volume, the operator reads it through the pods
``exec`` subresource (``tests/kubeexec.py``) and stops the sidecar; success is the task's
success with the result as XCom, a failing app fails the task with the worker's root cause
in its log, and a drain of the pod's node while it runs counts as a preemption (the pod
created again, on the other node) instead of an Airflow retry. Nothing is left behind:
no pod, no pod process.

The operator runs on this machine (as a worker does), not in a pod: the pods' network
namespaces cannot reach the test's API server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.harness import REPO, Cluster
from cluster.test_adapters_on_pods import airflow_home

pytestmark = pytest.mark.slow
APP = Path(__file__).resolve().parent / "apps" / "kpo_step.py"

DAG_FILE = """
from airflow.sdk import DAG
from torchx import specs
from torchstep_airflow import AppDefOperator


def app(name, *args):
    role = specs.Role(
        "step", image="python:3.11", entrypoint="python", args=[{app!r}, *args],
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
    )
    return specs.AppDef(name, roles=[role])


with DAG("kpo_on_pods", schedule=None) as dag:
    for task_id, args in {tasks!r}.items():
        AppDefOperator(task_id=task_id, app=app("kpo-" + task_id, *args), target="kubernetes",
                       cfg={{"namespace": "ml"}}, retries=0, deferrable=task_id.startswith("deferred"),
                       kubernetes_kwargs={{"poll_interval": 1}})
"""


def run_dag(cluster: Cluster, tmp_path: Path, tasks: dict[str, list[str]]) -> tuple[dict[str, Any], str]:
    """``dag.test()`` of a DAG with one 1-replica AppDefOperator per entry of ``tasks``
    (task id -> the app's arguments), in a child process with the cluster as Airflow's
    default kubernetes connection; its summary and its output."""
    # the connection alone: with $KUBECONFIG too, the deferred pod operator hands both to its
    # trigger, whose hook refuses them ("kube_config_path, kube_config ... mutually exclusive")
    env = airflow_home(
        tmp_path,
        str(cluster.kubeconfig),
        ("kpo_dag.py", DAG_FILE.format(app=str(APP), tasks=tasks)),
        connection_only=True,
    )
    dag_file = Path(env["AIRFLOW__CORE__DAGS_FOLDER"]) / "kpo_dag.py"
    driver = REPO / "tests" / "airflow" / "dag_test_driver.py"
    done = subprocess.run(
        [sys.executable, str(driver), str(dag_file), "kpo_on_pods", "{}"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=500,
    )
    text = done.stdout
    (tmp_path / "dag_test.log").write_text(text)  # the whole output, for a failure's reader
    marks = [x for x in text.splitlines() if x.startswith("DAG_TEST_SUMMARY ")]
    assert done.returncode == 0 and marks, text[-6000:]
    return json.loads(marks[-1].split(" ", 1)[1]), text


def nothing_left(cluster: Cluster, timeout: float = 90.0) -> None:
    cluster.wait(lambda: not cluster.items("pods"), timeout, "every pod to be deleted")
    cluster.wait(lambda: not cluster.pod_processes(), timeout, "every pod process to end")


class Drainer:
    """For each of ``prefixes``: drains the node of the first pod whose name starts with it
    once its step runs (the evicted pod's grace period ``grace_s``), and makes the node
    schedulable again once the pod's replacement exists; remembers every such pod it saw."""

    def __init__(self, cluster: Cluster, prefixes: list[str], grace_s: float) -> None:
        self.cluster, self.prefixes, self.grace_s = cluster, prefixes, grace_s
        self.pods: dict[str, dict[str, str]] = {p: {} for p in prefixes}  # prefix -> uid -> node
        self.drained: dict[str, str] = {}  # prefix -> the node drained
        self.healed: set[str] = set()
        self.notes: list[str] = []  # what it did when, for a failure's reader
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="drainer")

    def __enter__(self) -> Drainer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)
        for node in set(self.drained.values()):
            self.cluster.server.node(node, "heal")  # schedulable again for later tests

    def _training(self, pod: dict[str, Any]) -> bool:
        """Whether the pod's step runs (its line is in the log): a SIGTERM before the agent
        handles it would be lost, as for any container's PID 1 without a handler."""
        if pod["status"].get("phase") != "Running":
            return False
        try:
            return "kpo step running" in self.cluster.log(pod["metadata"]["name"])
        except Exception:  # gone meanwhile
            return False

    def _loop(self) -> None:
        while not self._stop.wait(0.2):
            try:
                pods = self.cluster.items("pods")
            except Exception as e:  # a read that raced the server: the next one sees it
                self.notes.append(f"{time.time():.1f} list failed: {e!r}")
                continue
            for pod in pods:
                prefix = next((p for p in self.prefixes if pod["metadata"]["name"].startswith(p)), None)
                node = pod["spec"].get("nodeName")
                if prefix is None or not node:
                    continue
                self.pods[prefix].setdefault(pod["metadata"]["uid"], node)
                if prefix not in self.drained and self._training(pod):
                    self.notes.append(f"{time.time():.1f} draining {node} of {pod['metadata']['name']}")
                    self.cluster.server.node(node, "drain", grace_s=self.grace_s)
                    self.drained[prefix] = node
                    self.notes.append(f"{time.time():.1f} drained {node}")
                elif prefix in self.drained and prefix not in self.healed and len(self.pods[prefix]) > 1:
                    self.cluster.server.node(self.drained[prefix], "heal")  # the replacement is placed
                    self.healed.add(prefix)
                    self.notes.append(f"{time.time():.1f} healed {self.drained[prefix]}")


def test_the_pod_path_runs_on_real_pods_reads_its_result_through_the_xcom_sidecar_and_absorbs_a_drain(
    module_cluster: Cluster, tmp_path: Path
) -> None:
    pytest.importorskip("airflow.providers.cncf.kubernetes")
    tasks = {"ok": [], "bad": ["--fail"], "drained": ["--hold", "15"], "deferred_drained": ["--hold", "15"]}
    with Drainer(module_cluster, ["kpo-drained", "kpo-deferred-drained"], grace_s=5) as drainer:
        summary, text = run_dag(module_cluster, tmp_path, tasks)
    ok, bad, drained, deferred = (summary["tasks"][t] for t in ("ok", "bad", "drained", "deferred_drained"))
    # success: the agent's result, read from the pod's XCom volume by the sidecar exec
    assert ok["state"] == "success" and ok["try_number"] == 1, text[-6000:]
    assert ok["xcom"]["state"] == "SUCCEEDED" and ok["xcom"]["outputs"] == {"answer": 42}, ok
    # failure: the task fails, the worker's error is the root cause in the task's log and XCom
    assert bad["state"] == "failed", text[-6000:]
    assert bad["xcom"]["state"] == "FAILED" and "bad batch 7: loss is nan" in json.dumps(bad["xcom"]), bad["xcom"]
    assert "ValueError: bad batch 7: loss is nan" in text
    # the drain: a preemption, the pod created again on the other node; no Airflow retry spent,
    # whether the task waited in the worker or deferred to the triggerer (dag.test runs it inline)
    for prefix, task in (("kpo-drained", drained), ("kpo-deferred-drained", deferred)):
        seen = drainer.pods[prefix]
        assert prefix in drainer.drained and len(seen) == 2, (prefix, drainer.pods, drainer.notes)
        assert set(seen.values()) == {"node-0", "node-1"}, (prefix, seen)
        assert task["state"] == "success" and task["try_number"] == 1, (prefix, text[-6000:])
        assert task["xcom"]["outputs"] == {"answer": 42}
        assert any(w.startswith("preempted 1 time") for w in task["xcom"]["warnings"]), task["xcom"]
    assert text.count("was preempted (DisruptionTarget") == 2, text[-6000:]
    nothing_left(module_cluster)
