"""A result comes only from the pod this task created (issue 24, section 2), on the
KubernetesPodOperator path of ``AppDefOperator`` (one role, one replica, a bare Pod).

No cluster exists here: the API is faked at the KubernetesPodOperator's own seams (hook,
client, pod manager), recording which pod each call reads; everything else — our operator,
the provider's ``execute_sync``, ``find_pod``'s label selector, reattach, cleanup — is the
real code. Someone allowed to create pods in the namespace pre-creates a pod with the
task's labels (run ids are predictable) and a forged result in its XCom file."""

from __future__ import annotations

import copy
import json
import types
from typing import Any

import pytest
from kpo_fakes import FakePodManager
from statestore import TaskStateStore as Store
from torchx import specs

pytest.importorskip("airflow.providers.cncf.kubernetes")
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator  # noqa: E402
from torchstep.kubernetes.ownership import UIDS_KEY  # noqa: E402
from torchstep.result import SUCCEEDED, StepResult  # noqa: E402
from torchstep_airflow import AppDefOperator  # noqa: E402


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


def result(loss: float) -> dict[str, Any]:
    return StepResult(app_id="train-1", state=SUCCEEDED, exit_code=0, outputs={"model_uri": f"s3://m/{loss}"}).to_dict()


def matches(labels: dict[str, str], selector: str) -> bool:
    for term in selector.split(","):
        if term.startswith("!"):
            if term[1:] in labels:
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        else:
            key, value = term.split("=", 1)
            if labels.get(key) != value:
                return False
    return True


class Cluster(FakePodManager):
    """The namespace: pods by name, each finished with the result in its XCom file."""

    def __init__(self) -> None:
        self.pods: dict[str, Any] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.created: list[str] = []
        self.logs_read: list[str] = []
        self.xcom_read: list[str] = []
        self.deleted: list[str] = []
        self.patched: list[str] = []

    def put(self, pod: Any, uid: str, value: dict[str, Any]) -> Any:
        stored = copy.deepcopy(pod)
        stored.metadata.uid = uid
        main = ns(name="main", state=ns(terminated=ns(exit_code=0), running=None, waiting=None))
        stored.status = ns(phase="Succeeded", container_statuses=[main], start_time=None)
        self.pods[stored.metadata.name] = stored
        self.results[stored.metadata.name] = value
        return stored

    # core v1 client
    def list_namespaced_pod(self, namespace: str, label_selector: str) -> Any:
        return ns(items=[p for p in self.pods.values() if matches(p.metadata.labels or {}, label_selector)])

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        self.patched.append(name)
        self.pods[name].metadata.labels.update(body["metadata"]["labels"])

    # pod manager
    def create_pod(self, pod: Any) -> Any:
        self.created.append(pod.metadata.name)
        return self.put(pod, f"uid-{len(self.created)}", result(0.25))  # the API answers with the uid

    def await_pod_start(self, pod: Any, **kwargs: Any) -> None:
        assert pod.metadata.name in self.pods

    def fetch_requested_container_logs(self, pod: Any, **kwargs: Any) -> list[Any]:
        self.logs_read.append(pod.metadata.name)
        return []

    def extract_xcom(self, pod: Any) -> str:
        self.xcom_read.append(pod.metadata.name)
        return json.dumps(self.results[pod.metadata.name])

    def delete_pod(self, pod: Any) -> None:
        self.deleted.append(pod.metadata.name)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    c = Cluster()
    for name in ("hook", "client", "pod_manager"):
        monkeypatch.setattr(KubernetesPodOperator, name, property(lambda self: c))
    return c


class TI:
    dag_id, task_id, run_id, map_index = "nightly", "fit", "scheduled__2026-11-21T00:00:00+00:00", -1

    def __init__(self, try_number: int) -> None:
        self.try_number = try_number
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def context(try_number: int, store: Store | None) -> dict[str, Any]:
    ti = TI(try_number)
    ctx: dict[str, Any] = {"ti": ti, "run_id": ti.run_id, "dag": ns(parent_dag=None), "task": None}
    if store is not None:
        ctx["task_state_store"] = store
    return ctx


def operator(**kubernetes_kwargs: Any) -> AppDefOperator:
    role = specs.Role(
        "trainer",
        image="ghcr.io/acme/train:1.0",
        entrypoint="python",
        args=["-m", "train"],
        resource=specs.Resource(cpu=2, gpu=0, memMB=4096),
    )
    return AppDefOperator(
        task_id="fit",
        app=specs.AppDef("train", roles=[role]),
        target="kubernetes",
        cfg={"namespace": "ml"},
        kubernetes_kwargs=kubernetes_kwargs,
    )


def pod_of(op: AppDefOperator, ctx: dict[str, Any]) -> Any:
    """The pod the task's KubernetesPodOperator would create for this try (its labels included)."""
    from torchstep_airflow.kubernetes import pod_operator, render
    from torchstep_airflow.settings import run_id_of

    rendered = render(op, op.build_app()[1], run_id_of(ctx))
    inner = pod_operator(op.task_id, rendered, op.kubernetes_kwargs, durable=op.durable)
    return inner.build_pod_request_obj(ctx)


def forge(cluster: Cluster, op: AppDefOperator, ctx: dict[str, Any]) -> str:
    """The attacker's bare pod: the task's labels (dag, task, run, torchstep's), its own name."""
    pod = pod_of(op, ctx)
    pod.metadata.name = "evil"
    cluster.put(pod, "uid-evil", result(666.0))
    return "evil"


def test_a_forged_pod_with_the_tasks_labels_is_ignored_and_the_task_runs_its_own(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store()
    op, ctx = operator(), context(1, store)
    forge(cluster, op, ctx)
    capsys.readouterr()
    out = op.execute(ctx)
    task_log = "".join(capsys.readouterr())
    assert out["outputs"] == {"model_uri": "s3://m/0.25"}  # the genuine result, not s3://m/666.0
    (mine,) = cluster.created
    assert cluster.logs_read == [mine] and cluster.xcom_read == [mine]  # the forged pod was never read
    assert store.values[UIDS_KEY] == {mine: "uid-1"}  # recorded at creation, for a retry's reattach
    warnings = [line for line in task_log.splitlines() if "ignoring pod ml/evil" in line]
    assert len(warnings) == 1 and "this task did not create it (uid uid-evil)" in warnings[0]  # said once
    assert "evil" not in cluster.deleted and "evil" not in cluster.patched  # someone else's: left alone


def test_a_retry_reattaches_only_to_the_pod_a_try_of_the_task_recorded(cluster: Cluster) -> None:
    store = Store()
    first = operator()
    # try 1 created its pod and recorded its uid, then its worker died (the pod is still there)
    genuine = pod_of(first, context(1, store))
    cluster.put(genuine, "uid-genuine", result(0.5))
    store.values[UIDS_KEY] = {genuine.metadata.name: "uid-genuine"}
    forge(cluster, first, context(1, store))
    out = operator().execute(context(2, store))
    assert out["outputs"] == {"model_uri": "s3://m/0.5"}  # reattached to try 1's own pod
    assert cluster.created == [] and cluster.xcom_read == [genuine.metadata.name]


def test_without_a_recorded_uid_a_labelled_pod_is_not_adopted(cluster: Cluster) -> None:
    """The store is there but names no pod: a pod with the task's labels is not this task's
    (before this fix KubernetesPodOperator adopted it and returned its forged result)."""
    store = Store()
    op = operator()
    forge(cluster, op, context(1, store))
    out = op.execute(context(1, store))
    assert out["outputs"] == {"model_uri": "s3://m/0.25"} and len(cluster.created) == 1
