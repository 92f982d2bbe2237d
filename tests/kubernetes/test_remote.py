"""``torchstep.kubernetes.remote``: a run's state read through its JSON handle from outside
its watcher (Airflow's triggerer). The rules are the watcher's: Job conditions, bare Pod
phases, preemptions against ``preemption_retries``, only the run's own objects count.
Against a small in-memory client answering dicts, as the API server would."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
import torchstep
from torchstep.kubernetes.remote import BARE_POD, GONE, RemoteRun

SEL = "torchstep/app-id=a"


class NotFound(Exception):
    status = 404


class Api:
    """Jobs and pods by name; every call recorded."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []

    def read_namespaced_job_status(self, name: str, ns: str) -> dict[str, Any]:
        if name not in self.jobs:
            raise NotFound(name)
        return self.jobs[name]

    def read_namespaced_pod_status(self, name: str, ns: str) -> dict[str, Any]:
        if name not in self.pods:
            raise NotFound(name)
        return self.pods[name]

    def list_namespaced_pod(self, ns: str, label_selector: str) -> Any:
        return types.SimpleNamespace(items=list(self.pods.values()))

    def list_namespaced_service(self, ns: str, label_selector: str) -> Any:
        return types.SimpleNamespace(items=[{"metadata": {"name": "a-svc"}}])

    def delete_collection_namespaced_job(self, ns: str, **kw: Any) -> None:
        self.deleted.append(f"jobs {kw['label_selector']} {kw['propagation_policy']}")

    def delete_collection_namespaced_pod(self, ns: str, **kw: Any) -> None:
        self.deleted.append(f"pods {kw['label_selector']} {kw['propagation_policy']}")

    def delete_namespaced_service(self, name: str, ns: str) -> None:
        self.deleted.append(f"service {name}")


def handle(*workloads: tuple[str, str, str], budget: int = 1) -> dict[str, Any]:
    return json.loads(
        json.dumps(
            {  # a JSON round trip, as through Airflow's trigger kwargs
                "namespace": "ml",
                "app_id": "a",
                "label_selector": SEL,
                "preemption_retries": budget,
                "queue": None,
                "workloads": [{"kind": k, "name": n, "uid": u} for k, n, u in workloads],
            }
        )
    )


def job(uid: str, condition: str | None = None) -> dict[str, Any]:
    conditions = [{"type": condition, "status": "True"}] if condition else []
    return {"metadata": {"uid": uid}, "spec": {}, "status": {"conditions": conditions}}


def pod(name: str, uid: str, owner: str | None, disrupted: bool = False, phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": uid}
    if owner:
        meta["owner_references"] = [{"kind": "Job", "name": "a-w", "uid": owner, "controller": True}]
    cond = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}] if disrupted else []
    return {"metadata": meta, "status": {"phase": phase, "conditions": cond}}


def test_states_follow_the_jobs_conditions() -> None:
    api = Api()
    api.jobs["a-w"] = job("j1")
    run = RemoteRun(handle(("Job", "a-w", "j1")), api)
    assert run.look()["state"] == "RUNNING"
    api.jobs["a-w"] = job("j1", "FailureTarget")
    assert run.look()["state"] == "FAILED"
    api.jobs["a-w"] = job("j1", "SuccessCriteriaMet")
    assert run.look()["state"] == "SUCCEEDED"


def test_a_run_is_gone_when_a_workload_is_deleted_or_replaced_by_another_uid() -> None:
    api = Api()
    run = RemoteRun(handle(("Job", "a-w", "j1")), api)
    assert run.look() == {"state": GONE, "workload": "a-w", "preempted_pods": {}, "evictions": 0}
    api.jobs["a-w"] = job("someone-else", "Complete")  # same name, not ours: never reported as our success
    assert run.look()["state"] == GONE


def test_preemptions_beyond_the_budget_end_the_run_and_impostors_do_not_count() -> None:
    api = Api()
    api.jobs["a-w"] = job("j1")
    run = RemoteRun(handle(("Job", "a-w", "j1"), budget=1), api)
    api.pods["forged"] = pod("forged", "p0", owner="not-our-job", disrupted=True)
    assert run.look()["state"] == "RUNNING"  # an impostor's disruption is not ours
    api.pods["a-w-0"] = pod("a-w-0", "p1", owner="j1", disrupted=True)
    first = run.look()
    assert first["state"] == "RUNNING" and first["preempted_pods"] == {"p1": "a-w-0"}  # 1 of at most 1
    assert run.look()["state"] == "RUNNING"  # the same pod read again counts once
    api.pods["a-w-0b"] = pod("a-w-0b", "p2", owner="j1", disrupted=True)
    assert run.look()["state"] == "PREEMPTED"


def test_a_preempted_bare_pod_needs_a_watcher_to_create_it_again() -> None:
    api = Api()
    api.jobs["a-w"] = job("j1")
    api.pods["a-ps"] = pod("a-ps", "p9", owner=None, disrupted=True)
    run = RemoteRun(handle(("Job", "a-w", "j1"), ("Pod", "a-ps", "p9"), budget=2), api)
    look = run.look()
    assert look["state"] == BARE_POD and look["workload"] == "a-ps"


def test_delete_removes_every_object_by_the_runs_selector() -> None:
    api = Api()
    RemoteRun(handle(("Job", "a-w", "j1")), api).delete()
    assert api.deleted == [f"jobs {SEL} Foreground", f"pods {SEL} Foreground", "service a-svc"]


def test_a_handle_that_is_not_one_is_refused_by_name() -> None:
    with pytest.raises(torchstep.SpecError) as err:
        RemoteRun({"namespace": "ml"}, Api())
    assert err.value.field == "handle" and "handle_of" in str(err.value)
