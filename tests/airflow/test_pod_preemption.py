"""Preemption is not failure on the KubernetesPodOperator path of ``AppDefOperator`` (one role,
one replica: a bare Pod, issue 36 goal 3): a pod that Kubernetes took away (the
``DisruptionTarget`` condition: a drain, an API eviction, a scheduler preemption) is created
again under the same name by the task itself, from the run option ``preemption_retries``,
never from Airflow's ``retries``; one preemption more than that ends the step PREEMPTED,
not retryable (``AirflowFailException``). A failure without the condition, or a
non-retryable exit (82) of a disrupted pod, is the step's own, as before.

No cluster (and no exec for the XCom sidecar) exists here: the API is faked at the
KubernetesPodOperator's own seams (hook, client, pod manager) as in test_pod_ownership.py;
the provider's ``execute_sync``, its cleanup (which raises "returned a failure" for the
evicted pod) and our operator are the real code."""

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
from airflow.sdk.exceptions import AirflowException, AirflowFailException  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from torchstep.result import CANCELLED, FAILED, SUCCEEDED, StepResult  # noqa: E402
from torchstep_airflow import AppDefOperator  # noqa: E402

EVICTED = {"reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}


def ns(**kw: Any) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kw)


class Cluster(FakePodManager):
    """The namespace: each created pod ends as ``script`` says for its turn: ``ok`` (exit 0,
    SUCCEEDED), ``evicted`` (``DisruptionTarget``, the agent SIGTERMed: exit 143, CANCELLED),
    ``failed`` (exit 1, FAILED, no condition), ``evicted-82`` (``DisruptionTarget``, but the
    worker had raised NonRetryableError: exit 82), ``gone`` (evicted with ``DisruptionTarget``
    and deleted at once, while the operator waits: its reads answer 404, only a watch from an
    earlier resourceVersion replays how it ended), ``deleted`` (the same without the
    condition: someone deleted it)."""

    def __init__(self, script: list[str]) -> None:
        self.script = script
        self.pods: dict[str, Any] = {}
        self.results: dict[str, dict[str, Any]] = {}
        self.created: list[tuple[str, str]] = []  # (name, uid)
        self.deleted: list[str] = []  # uids
        self.history: list[dict[str, Any]] = []  # watch events, each with its resourceVersion
        self.version = 0

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    # pod manager
    def create_pod(self, pod: Any) -> Any:
        assert pod.metadata.name not in self.pods, "created while the old pod was still there"
        turn = self.script[len(self.created)]
        uid = f"uid-{len(self.created) + 1}"
        self.created.append((pod.metadata.name, uid))
        stored = copy.deepcopy(pod)
        stored.metadata.uid = uid
        stored.metadata.resource_version = self._bump()
        code, state = {"ok": (0, SUCCEEDED), "failed": (1, FAILED), "evicted-82": (82, FAILED)}.get(
            turn, (143, CANCELLED)
        )
        main = ns(name="main", state=ns(terminated=ns(exit_code=code, message=None), running=None, waiting=None))
        conditions = [ns(type="DisruptionTarget", status="True", **EVICTED)] if turn.startswith("evicted") else []
        phase = "Succeeded" if code == 0 else "Failed"
        stored.status = ns(phase=phase, container_statuses=[main], start_time=None, conditions=conditions)
        if turn in ("gone", "deleted"):  # running when created; it vanishes during the wait
            running = ns(name="main", state=ns(terminated=None, running=ns(started_at=None), waiting=None))
            stored.status = ns(phase="Running", container_statuses=[running], start_time=None, conditions=[])
        self.pods[stored.metadata.name] = stored
        self.results[uid] = StepResult(
            app_id="train-1", state=state, exit_code=code, retryable=code != 82, outputs={"turn": turn}
        ).to_dict()
        return stored

    def fetch_requested_container_logs(self, pod: Any, **kwargs: Any) -> list[Any]:
        stored = self._stored(pod)
        turn = self.script[len(self.created) - 1]
        if turn not in ("gone", "deleted"):
            return []
        # evicted (DisruptionTarget) or deleted while its log is followed: the log ends, every
        # later read answers 404, only a watch from an earlier resourceVersion replays it
        gone = {"metadata": {"name": stored.metadata.name, "namespace": "ml", "uid": stored.metadata.uid}}
        if turn == "gone":
            condition = {"type": "DisruptionTarget", "status": "True", **EVICTED}
            gone["status"] = {"phase": "Failed", "conditions": [condition]}
            self.history.append({"type": "MODIFIED", "object": copy.deepcopy(gone), "rv": self._bump()})
        self.history.append({"type": "DELETED", "object": gone, "rv": self._bump()})
        self._delete(pod.metadata.name)
        return []

    def _stored(self, pod: Any) -> Any:
        if pod.metadata.name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return self.pods[pod.metadata.name]

    def read_pod(self, pod: Any) -> Any:
        return self._stored(pod)

    def await_xcom_sidecar_container_start(self, pod: Any) -> None:
        self._stored(pod)

    def await_pod_completion(self, pod: Any, istio_enabled: bool = False, container_name: str = "main") -> Any:
        return self._stored(pod)

    def get_pod(self, name: str, namespace: str) -> Any:  # the hook's read after a deferral
        return self.read_namespaced_pod(name, namespace)

    def read_namespaced_pod_log(self, **kwargs: Any) -> list[bytes]:
        return []

    def extract_xcom(self, pod: Any) -> str:
        return json.dumps(self.results[self._stored(pod).metadata.uid])

    def delete_pod(self, pod: Any) -> None:  # KubernetesPodOperator's on_finish_action
        self._delete(pod.metadata.name)

    # core v1 client
    def list_namespaced_pod(self, namespace: str, label_selector: str, watch: bool = False, **kw: Any) -> Any:
        if not watch:
            return ns(items=list(self.pods.values()))
        since = int(kw["resource_version"])  # kubernetes.watch reads the events as JSON lines
        lines = [
            json.dumps(
                {
                    "type": e["type"],
                    "object": {**e["object"], "metadata": {**e["object"]["metadata"], "resourceVersion": e["rv"]}},
                }
            ).encode()
            + b"\n"
            for e in self.history
            if int(e["rv"]) > since
        ]
        return ns(stream=lambda **_: iter(lines), release_conn=lambda: None, close=lambda: None, shutdown=lambda: None)

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any]) -> None:
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        self.pods[name].metadata.labels.update(body["metadata"]["labels"])

    def read_namespaced_pod(self, name: str, namespace: str) -> Any:
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        return self.pods[name]

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        if name not in self.pods:
            raise ApiException(status=404, reason="Not Found")
        self._delete(name)

    def _delete(self, name: str) -> None:
        pod = self.pods.pop(name, None)
        if pod is not None:
            self.deleted.append(pod.metadata.uid)


def cluster(monkeypatch: pytest.MonkeyPatch, *script: str) -> Cluster:
    c = Cluster(list(script))
    for name in ("hook", "client", "pod_manager"):
        monkeypatch.setattr(KubernetesPodOperator, name, property(lambda self: c))
    return c


class TI:
    dag_id, task_id, run_id, map_index, try_number = "nightly", "fit", "manual__1", -1, 1

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


def context() -> dict[str, Any]:
    ti = TI()
    return {"ti": ti, "run_id": ti.run_id, "dag": ns(parent_dag=None), "task": None, "task_state_store": Store()}


def operator(deferrable: bool = False, **cfg: Any) -> AppDefOperator:
    role = specs.Role("trainer", image="ghcr.io/acme/train:1.0", entrypoint="python", args=["-m", "train"])
    return AppDefOperator(
        task_id="fit",
        app=specs.AppDef("train", roles=[role]),
        target="kubernetes",
        cfg={"namespace": "ml", **cfg},
        deferrable=deferrable,
        retries=3,  # Airflow's: a preemption must not spend them
    )


def test_an_evicted_pod_is_created_again_and_the_step_succeeds_without_an_airflow_retry(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster(monkeypatch, "evicted", "ok")
    out = operator().execute(context())  # one try: no exception, so Airflow never retries
    assert out["state"] == SUCCEEDED and out["outputs"] == {"turn": "ok"}
    (name, _), (again, _) = c.created
    assert again == name  # the same pod, created again under its name
    assert "uid-1" in c.deleted  # only once the evicted one was gone
    assert any(
        w.startswith("preempted 1 time (1 pod(s) with DisruptionTarget, 0 Kueue eviction(s)); preemption_retries=10")
        for w in out["warnings"]
    ), out["warnings"]
    log = capsys.readouterr()
    said = log.out + log.err
    assert f"torchstep: pod {name} was preempted (DisruptionTarget: EvictionByEvictionAPI" in said
    assert "preemption 1 of at most 10 (preemption_retries); the step's retries are untouched" in said
    assert f"torchstep: pod {name} created again after its preemption" in said


def test_preemptions_beyond_the_budget_end_the_step_preempted_and_not_retryable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = cluster(monkeypatch, "evicted", "evicted", "ok")
    ctx = context()
    with pytest.raises(AirflowFailException, match=r"not retryable") as raised:
        operator(preemption_retries=1).execute(ctx)
    assert len(c.created) == 2  # the first preemption was absorbed, the second is one too many
    result = ctx["ti"].xcom["return_value"]
    assert result["state"] == "PREEMPTED" and result["retryable"] is False
    assert result["message"].startswith("preempted 2 times, more than preemption_retries=1 allows")
    said = str(raised.value)  # the task log's error names the cause and the fix
    assert "PREEMPTED" in said and "fix: raise preemption_retries" in said


def test_a_failure_without_disruption_is_the_steps_own_and_airflow_retries_it(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(monkeypatch, "failed", "ok")
    with pytest.raises(AirflowException) as raised:
        operator().execute(context())
    assert not isinstance(raised.value, AirflowFailException)  # retryable: Airflow's retries own it
    assert len(c.created) == 1  # not created again by the task


def test_a_non_retryable_exit_of_a_disrupted_pod_stops_every_retry_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(monkeypatch, "evicted-82", "ok")
    with pytest.raises(AirflowFailException):
        operator().execute(context())
    assert len(c.created) == 1  # exit 82 wins over the disruption, as in the Jobs' podFailurePolicy


def test_a_pod_evicted_and_deleted_before_the_operator_reads_it_counts_as_a_preemption(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster(monkeypatch, "gone", "ok")
    out = operator().execute(context())  # no exception: no Airflow retry spent on it
    assert out["state"] == SUCCEEDED and out["outputs"] == {"turn": "ok"}
    assert [n for n, _ in c.created] == [c.created[0][0]] * 2  # created again under its name
    assert any(w.startswith("preempted 1 time") for w in out["warnings"]), out["warnings"]
    log = capsys.readouterr()
    assert "was preempted (DisruptionTarget: EvictionByEvictionAPI" in log.out + log.err


def test_a_pod_deleted_without_disruption_is_still_the_steps_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    c = cluster(monkeypatch, "deleted", "ok")
    with pytest.raises(ApiException) as raised:  # the operator's own error for a vanished pod
        operator().execute(context())
    assert raised.value.status == 404  # not AirflowFailException: Airflow's retries own it
    assert len(c.created) == 1


def resume(event_of: Any, deferred: Any, ctx: dict[str, Any], keep: bool, **cfg: Any) -> Any:
    """What Airflow does when the trigger fires: a fresh operator in a worker, resumed with
    the deferral's keywords (``keep``; ``dag.test()`` keeps only the event) and the
    trigger's event."""
    kwargs = {**((deferred.kwargs or {}) if keep else {}), "event": event_of(deferred)}
    return operator(**cfg, deferrable=True).resume_execution(deferred.method_name, kwargs, ctx)


@pytest.mark.parametrize("keep", [True, False], ids=["triggerer", "dag-test"])
def test_preemptions_counted_before_a_deferral_still_count_after_it(
    monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    from airflow.sdk.exceptions import TaskDeferred

    c = cluster(monkeypatch, "evicted", "evicted", "ok")
    ctx = context()

    def failed(deferred: Any) -> dict[str, Any]:
        name = deferred.trigger.pod_name
        return {"status": "failed", "name": name, "namespace": "ml", "message": "pod failed"}

    with pytest.raises(TaskDeferred) as first:
        operator(preemption_retries=1, deferrable=True).execute(ctx)
    with pytest.raises(TaskDeferred) as second:  # preemption 1 of 1: created again, deferred again
        resume(failed, first.value, ctx, keep, preemption_retries=1)
    assert len(c.created) == 2
    with pytest.raises(AirflowFailException, match="not retryable"):  # preemption 2 of 1: over the budget
        resume(failed, second.value, ctx, keep, preemption_retries=1)
    assert len(c.created) == 2
    result = ctx["ti"].xcom["return_value"]
    assert result["state"] == "PREEMPTED"
    assert result["message"].startswith("preempted 2 times, more than preemption_retries=1 allows")
