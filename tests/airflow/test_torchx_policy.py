"""The generic DAG under the deployment's policy (issue 24), with Airflow's real
``dag.test()``: a stranger who may trigger runs sends AppDefs that reach the host or the
cluster's trust; each run fails at once, without a retry, with the field and the rule in the
task log, and nothing is created — no process runs, no Job or Pod reaches the cluster.
The controls (an allowed AppDef on each target) show the same harness sees what is created."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from torchstep.components.appjson import app_to_dict
from torchx import specs

DAG_ID = "torchstep_policy_test"


def role(marker: Path, **kw) -> specs.Role:
    """The stranger's payload: it would leave ``marker`` behind if it ever ran."""
    kw.setdefault("resource", specs.Resource(cpu=1, gpu=0, memMB=256))
    return specs.Role("payload", image="ghcr.io/acme/tool:1", entrypoint="sh", args=["-c", f"touch {marker}"], **kw)


def conf(r: specs.Role, target: str = "local", cfg: dict | None = None) -> dict:
    return {"app": app_to_dict(specs.AppDef("payload", roles=[r])), "target": target, "cfg": cfg or {}}


@pytest.fixture(scope="module")
def kube(tmp_path_factory):
    """A fake Kubernetes API (tests/kubehttp.py) as Airflow's default kubernetes connection."""
    kubehttp = pytest.importorskip("kubehttp")
    pytest.importorskip("airflow.providers.cncf.kubernetes")
    server = kubehttp.start_server(tmp_path_factory.mktemp("kube"), kubehttp.Scenario(replicas=2, run_s=1, lines=2))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tester(dag_tester, kube):
    t = type(dag_tester)(dag_tester.home)  # the session's Airflow home, with its own environment
    connection = {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube.kubeconfig), "namespace": "ml"}}
    t.env = {**dag_tester.env, "AIRFLOW_CONN_KUBERNETES_DEFAULT": json.dumps(connection)}
    t.env.pop("TORCHSTEP_POLICY", None)  # the deployment names none: DEFAULT
    return t


def stranger_confs(marker: Path) -> list[tuple[str, dict]]:
    overlay = {"hostPID": True, "containers": [{"name": "main", "securityContext": {"privileged": True}}]}
    return [
        (
            "app.roles[0].mounts[0].src_path",
            conf(role(marker, mounts=[specs.BindMount(src_path="/", dst_path="/host")])),
        ),
        (
            "app.roles[0].mounts[0].src_path",
            conf(role(marker, mounts=[specs.DeviceMount(src_path="/dev/mem", dst_path="/dev/mem")])),
        ),
        ("app.roles[0].env['LD_PRELOAD']", conf(role(marker, env={"LD_PRELOAD": "/tmp/evil.so"}))),
        (
            "app.roles[0].metadata['kubernetes']['hostPID']",
            conf(role(marker, num_replicas=2, metadata={"kubernetes": overlay}), "kubernetes"),
        ),
        ("cfg['namespace']", conf(role(marker, num_replicas=2), "kubernetes", {"namespace": "kube-system"})),
        ("cfg['service_account']", conf(role(marker, num_replicas=2), "kubernetes", {"service_account": "admin"})),
    ]


@pytest.mark.slow
def test_a_strangers_runs_are_refused_at_once_and_create_nothing(tester, kube, tmp_path):
    """Six refused requests, then the controls: allowed AppDefs do run — the local payload
    leaves its marker, the kubernetes one creates its Job on the fake cluster (all in one
    process: Airflow starts once)."""
    marker = tmp_path / f"ran-{uuid.uuid4().hex[:6]}"
    cases = stranger_confs(marker)
    allowed = tmp_path / "ran-local"
    controls = [conf(role(allowed)), conf(role(tmp_path / "unused", num_replicas=2), "kubernetes")]
    *runs, local, remote = tester.run_many(DAG_ID, [c for _, c in cases] + controls)
    for (field, c), run in zip(cases, runs, strict=True):
        task, out = run["tasks"]["app"], run["output"]
        assert run["state"] == "failed" and task["state"] == "failed", (field, out[-3000:])
        assert task["try_number"] == 1 and task["max_tries"] == 0  # AirflowFailException: never retried
        said = f"torchstep: {field} (target '{c['target']}')"
        assert said in out, (field, out[-3000:])
        assert "the deployment's policy" in out[out.index(said) :][:800], out[out.index(said) :][:800]
    assert not marker.exists(), "the payload ran"
    # the controls ran after the refusals: only they created anything
    assert local["state"] == "success", local["output"][-3000:]
    assert allowed.exists()
    state = kube.state()  # what the kubernetes control creates: its Job and its headless Service, nothing more
    created = (state["jobs_created"], state["pods_created"], state["services_created"])
    assert created == (1, 0, 1), (state, remote["output"][-3000:])


def test_torchx_dag_takes_a_policy_and_passes_access_control_through(tmp_path, monkeypatch):
    from torchstep.policy import Policy, PolicyError
    from torchstep_airflow.torchx_dag import app_from_conf, torchx_dag

    access = {"ml-engineers": {"DAGs": {"can_read"}, "DAG Runs": {"can_read", "can_create"}}}
    file = tmp_path / "policy.toml"
    file.write_text('namespaces = ["ml"]\n')
    dag = torchx_dag("policy_unit", policy=str(file), access_control=access)
    assert dag.access_control == access
    assert dag.get_task("app").policy == Policy(namespaces=("ml",))  # read when the DAG file is parsed
    file.write_text('namespace = ["ml"]\n')
    with pytest.raises(PolicyError, match="namespace: unknown key"):  # an import error of the DAG file
        torchx_dag("policy_unit_bad", policy=str(file))

    # app_from_conf: the policy given, else the worker's TORCHSTEP_POLICY, else DEFAULT
    request = conf(role(tmp_path / "m", num_replicas=2), "kubernetes", {"namespace": "ml"})
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)
    with pytest.raises(
        PolicyError, match=r"^cfg\['namespace'\] \(target 'kubernetes'\): namespace 'ml' is not allowed"
    ):
        app_from_conf(request)
    assert app_from_conf(request, policy=Policy(namespaces=("ml",)))[2] == {"namespace": "ml"}
    file.write_text('namespaces = ["ml"]\n')
    monkeypatch.setenv("TORCHSTEP_POLICY", str(file))
    assert app_from_conf(request)[1] == "kubernetes"
