"""The generic flow under the deployment's policy (issue 24), with Prefect's real engine: a
stranger who may create flow runs of ``torchstep-torchx`` sends AppDefs that reach the host
or the cluster's trust; each flow run fails at once (no retry, no task run), the field and
the rule in its state, and nothing is created — no process, no Kubernetes object. The
controls (allowed AppDefs) show the same harness sees what is created. ``serve --policy``
hands the deployment's file to the flow runs of a real served deployment."""

# No `from __future__ import annotations`: Prefect reads the flows' annotations.
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kubefake import FakeKube
from netlib import free_port
from proclib import wait_for
from torchstep.components.appjson import app_to_dict
from torchstep.policy import Policy, PolicyError
from torchx import specs

pytest.importorskip("prefect")
httpx = pytest.importorskip("httpx")
from prefect.client.orchestration import get_client  # noqa: E402
from torchstep_prefect.torchx_flow import load_app, torchx_app  # noqa: E402

BIN = Path(sys.executable).parent


def role(marker: Path, **kw) -> specs.Role:
    """The stranger's payload: it would leave ``marker`` behind if it ever ran."""
    kw.setdefault("resource", specs.Resource(cpu=1, gpu=0, memMB=256))
    return specs.Role("payload", image="ghcr.io/acme/tool:1", entrypoint="sh", args=["-c", f"touch {marker}"], **kw)


def data(r: specs.Role) -> dict:
    return app_to_dict(specs.AppDef("payload", roles=[r]))


@pytest.fixture
def kube(monkeypatch: pytest.MonkeyPatch) -> FakeKube:
    """The flow's Kubernetes client (it builds one from the kubeconfig): an in-memory API."""
    from torchstep.kubernetes.client import OfficialClient

    fake = FakeKube()
    monkeypatch.setattr(OfficialClient, "from_config", classmethod(lambda cls, **kw: fake))
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)
    return fake


def task_runs_of(flow_run_id) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))


@pytest.mark.usefixtures("prefect_harness")
def test_a_strangers_flow_runs_fail_at_once_and_create_nothing(kube: FakeKube, tmp_path: Path) -> None:
    marker = tmp_path / f"ran-{uuid.uuid4().hex[:6]}"
    overlay = {"hostPID": True, "containers": [{"name": "main", "securityContext": {"privileged": True}}]}
    cases = [
        (
            "app.roles[0].mounts[0].src_path",
            role(marker, mounts=[specs.BindMount(src_path="/", dst_path="/host")]),
            "local",
            {},
        ),
        (
            "app.roles[0].mounts[0].src_path",
            role(marker, mounts=[specs.DeviceMount(src_path="/dev/mem", dst_path="/dev/mem")]),
            "local",
            {},
        ),
        ("app.roles[0].env['LD_PRELOAD']", role(marker, env={"LD_PRELOAD": "/tmp/evil.so"}), "local", {}),
        ("cfg['inherit_env']", role(marker), "local", {"inherit_env": True}),
        (
            "app.roles[0].metadata['kubernetes']['hostPID']",
            role(marker, metadata={"kubernetes": overlay}),
            "kubernetes",
            {},
        ),
        ("cfg['namespace']", role(marker), "kubernetes", {"namespace": "kube-system"}),
        ("cfg['service_account']", role(marker), "kubernetes", {"service_account": "admin"}),
    ]
    for field, r, target, cfg in cases:
        state = torchx_app(app=data(r), target=target, cfg=cfg, return_state=True)
        assert state.is_failed(), (field, state)
        err = state.result(raise_on_failure=False)
        assert isinstance(err, PolicyError) and err.field == field, (field, err)
        assert f"{field} (target '{target}')" in state.message and "the deployment's policy" in state.message
        assert task_runs_of(state.state_details.flow_run_id) == []  # no step task was ever made
        with get_client(sync_client=True) as client:
            assert client.read_flow_run(state.state_details.flow_run_id).run_count == 1  # never retried
    assert not marker.exists(), "the payload ran"
    assert kube.objects == []


@pytest.mark.usefixtures("prefect_harness")
def test_the_same_harness_sees_what_an_allowed_flow_run_creates(kube: FakeKube, tmp_path: Path) -> None:
    marker = tmp_path / "ran-local"
    state = torchx_app(app=data(role(marker)), target="local", return_state=True)
    assert state.is_completed(), state
    assert marker.exists()
    torchx_app(app=data(role(tmp_path / "unused")), target="kubernetes", cfg={"active_deadline": 60}, return_state=True)
    assert [o["kind"] for o in kube.objects] == ["Pod"]


def test_load_app_takes_the_policy_given_else_the_deployments_file(tmp_path: Path, monkeypatch) -> None:
    ok = data(role(tmp_path / "m", num_replicas=4))
    monkeypatch.delenv("TORCHSTEP_POLICY", raising=False)
    assert load_app(ok, "kubernetes", cfg={"namespace": None}).roles[0].num_replicas == 4
    with pytest.raises(PolicyError, match=r"app\.roles\[0\]\.num_replicas .*at most 2"):
        load_app(ok, "kubernetes", Policy(replicas=2))
    policy = tmp_path / "policy.toml"
    policy.write_text('targets = ["kubernetes"]\n')
    monkeypatch.setenv("TORCHSTEP_POLICY", str(policy))
    with pytest.raises(PolicyError, match=r"^target \(target 'local'\): target 'local' is not allowed"):
        load_app(ok, "local")
    with pytest.raises(PolicyError, match=r"cfg\['namespace'\]"):
        load_app(ok, "kubernetes", str(policy), cfg={"namespace": "kube-system"})


def test_serve_refuses_to_start_with_a_bad_policy_file(tmp_path: Path) -> None:
    bad = tmp_path / "policy.toml"
    bad.write_text('namespace = ["ml"]\n')  # a typo: namespaces
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_prefect.torchx_flow", "serve", "--policy", str(bad)],
        env={**env, "PREFECT_API_URL": "http://127.0.0.1:9/api"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "namespace: unknown key in the policy file" in out.stderr and "namespaces" in out.stderr


@pytest.mark.slow
def test_serve_policy_reaches_every_flow_run_of_a_served_deployment(tmp_path: Path) -> None:
    """A real server and ``serve --policy FILE``: the file allows only the kubernetes target,
    so a flow run of a local AppDef fails at once naming the rule, and its payload never runs."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    policy = tmp_path / "policy.toml"
    policy.write_text('targets = ["kubernetes"]\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TORCHSTEP_POLICY"))}
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
            "XDG_STATE_HOME": str(tmp_path / "state"),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
    )
    procs = []
    logs = [open(tmp_path / "server.log", "wb"), open(tmp_path / "serve.log", "wb")]  # noqa: SIM115
    try:
        procs.append(
            subprocess.Popen(
                [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                stdout=logs[0],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

        def healthy() -> bool:
            try:
                return httpx.get(f"{api}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 180, "the Prefect server", interval=0.5)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "torchstep_prefect.torchx_flow", "serve", "--policy", str(policy)],
                env={**env, "PREFECT_API_URL": api, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},
                stdout=logs[1],
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
                start_new_session=True,
            )
        )
        dep = wait_for(
            lambda: _json(httpx.get(f"{api}/deployments/name/torchstep-torchx/torchx", timeout=5)),
            120,
            "the served deployment",
            interval=0.5,
        )
        marker = tmp_path / "ran"
        r = _retrying(
            "POST",
            f"{api}/deployments/{dep['id']}/create_flow_run",
            json={"parameters": {"app": data(role(marker)), "target": "local"}},
        )
        assert r.status_code == 201, r.text
        run_id = r.json()["id"]

        def ended() -> dict | None:
            run = _retrying("GET", f"{api}/flow_runs/{run_id}").json()
            return run if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED") else None

        run = wait_for(ended, 180, "the flow run", interval=0.5)
        assert run["state"]["type"] == "FAILED" and run["run_count"] == 1, run["state"]
        assert "target 'local' is not allowed by the deployment's policy" in run["state"]["message"]
        assert not marker.exists()
        assert f"checked against the policy {policy}" in (tmp_path / "serve.log").read_text()
    finally:
        for p in procs:
            os.killpg(p.pid, 15)
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
        for f in logs:
            f.close()


def _retrying(method: str, url: str, **kw) -> httpx.Response:
    """A request as Prefect's own client sends it: a 503 (the server's database busy: SQLite
    under a loaded machine) is sent again after a pause, for up to 60 s."""
    deadline = time.monotonic() + 60
    while True:
        r = httpx.request(method, url, timeout=10, **kw)
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(1.0)


def _json(resp):
    return resp.json() if resp.status_code == 200 else None
