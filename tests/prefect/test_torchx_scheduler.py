"""``torchx run -s prefect``: the ``prefect`` TorchX scheduler and the generic flow it submits to.

Unit tests (no server): cfg checks, dryrun, the state mapping, the log split by role. The
rest runs against a real ``prefect server start`` (loopback port, own PREFECT_HOME and
SQLite) with ``python -m torchstep_prefect.torchx_flow serve`` beside it, one pair for the
whole module: submit through the TorchX runner and CLI, status/log/list/cancel from other
processes (with and without the record), a broken AppDef sent straight to the API.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from netlib import FaultyProxy, api_call, free_port
from proclib import procs_with_env, wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("prefect")

from torchstep.errors import SpecError  # noqa: E402
from torchstep.schedulers import prefect as ts  # noqa: E402
from torchstep.schedulers.base import SchedulerError  # noqa: E402
from torchx.runner import get_runner  # noqa: E402
from torchx.specs import AppDef, AppState, Role, is_terminal  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SLEEPER = str(ROOT / "tests" / "apps" / "steps.py") + ":sleeper"
ECHO_API = "http://127.0.0.1:4200/api"


@pytest.fixture(autouse=True)
def _private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # records of this test only
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_API_KEY", raising=False)
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)


# -- without a server --------------------------------------------------------------------
def test_runopts_list_every_option_with_its_default() -> None:
    text = str(ts.create_scheduler("t").run_opts())
    for name in ("endpoint", "api_key_env", "auth_string_env", "deployment", "queue", "tags", "target", "namespace"):
        assert f"{name}=" in text
    assert "torchstep-torchx/torchx" in text and "PREFECT_API_KEY" in text


def test_dryrun_prints_the_deployment_and_the_exact_flow_run_parameters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_do-not-print-me")
    info = get_runner().dryrun_component(
        "utils.echo", ["--msg", "hi"], "prefect", cfg={"endpoint": ECHO_API + "/", "tags": ["a", "b"]}
    )
    text = str(info)
    assert "POST http://127.0.0.1:4200/api/deployments/{id of torchstep-torchx/torchx}/create_flow_run" in text
    assert "GET /deployments/name/torchstep-torchx/torchx" in text
    body = json.loads(text[text.index("{\n") :])
    assert body["parameters"]["target"] == "local" and body["parameters"]["cfg"] == {}
    assert body["parameters"]["app"]["roles"][0]["args"] == ["hi"]
    assert body["parameters"]["app"]["roles"][0]["env"]["TORCHX_JOB_ID"] == f"prefect://torchx/{body['name']}"
    assert body["tags"] == ["a", "b"] and body["name"] == body["idempotency_key"]
    assert body["name"].startswith("echo-") and "work_queue_name" not in body
    assert "pnu_do-not-print-me" not in text and "$PREFECT_API_KEY" in text


def test_dryrun_kubernetes_target_passes_the_namespace_and_the_queue() -> None:
    info = get_runner().dryrun_component(
        "utils.echo",
        ["--msg", "hi"],
        "prefect",
        cfg={
            "endpoint": ECHO_API,
            "target": "kubernetes",
            "namespace": "ml",
            "queue": "gpu",
            "deployment": "torchstep-torchx/k8s",
        },
    )
    text = str(info)
    body = json.loads(text[text.index("{\n") :])
    assert body["parameters"]["target"] == "kubernetes" and body["parameters"]["cfg"] == {"namespace": "ml"}
    assert body["work_queue_name"] == "gpu" and "torchstep-torchx/k8s" in text


def test_dryrun_rejects_an_appdef_the_target_cannot_run_naming_the_field() -> None:
    app = AppDef("bad", roles=[Role("w", image="", entrypoint="echo", num_replicas=0)])
    with pytest.raises(SpecError, match=r"roles\[0\]\.num_replicas"):
        ts.create_scheduler("t").submit_dryrun(app, {"endpoint": ECHO_API})


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({"nope": "1"}, r"cfg\['nope'\]: unknown option.*fix: use one of: endpoint"),
        ({"target": "slurm"}, r"cfg\['target'\]: unknown target 'slurm'; fix: -cfg target=local\|kubernetes"),
        ({"namespace": "ml"}, r"cfg\['namespace'\]: only applies to target=kubernetes"),
        ({"target": "kubernetes", "namespace": "ML_ns"}, r"cfg\['namespace'\]: 'ML_ns' is not a Kubernetes namespace"),
        ({"deployment": "torchx"}, r"cfg\['deployment'\]: 'torchx' is not FLOW/NAME"),
        (
            {"endpoint": "127.0.0.1:4200"},
            r"cfg\['endpoint'\]: is not an http\(s\) URL \(not shown\); fix: give the Prefect API URL",
        ),
        ({"queue": ""}, r"cfg\['queue'\]: must be a non-empty string"),
    ],
)
def test_cfg_errors_name_the_option_and_the_fix(cfg: dict[str, Any], match: str) -> None:
    app = AppDef("ok", roles=[Role("w", image="", entrypoint="echo")])
    with pytest.raises(SpecError, match=match):
        ts.create_scheduler("t").submit_dryrun(app, cfg)


@pytest.mark.parametrize(
    ("cfg", "secret"),
    [
        ({"api_key_env": "pnu_0123456789abcdef"}, "pnu_0123456789abcdef"),
        ({"auth_string_env": "admin:hunter2"}, "hunter2"),
        ({"endpoint": "https://admin:hunter2@prefect.example/api"}, "hunter2"),
    ],
)
def test_a_secret_given_in_cfg_is_refused_and_never_echoed(cfg: dict[str, Any], secret: str) -> None:
    app = AppDef("ok", roles=[Role("w", image="", entrypoint="echo")])
    with pytest.raises(SpecError) as err:
        ts.create_scheduler("t").submit_dryrun(app, cfg)
    assert secret not in str(err.value) and "fix:" in str(err.value)


def test_credentials_come_from_the_named_variables_and_an_unset_one_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEAM_PREFECT_KEY", "pnu_abc")
    assert ts.PrefectAPI(ECHO_API, "TEAM_PREFECT_KEY").headers == {"Authorization": "Bearer pnu_abc"}
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "admin:pass")  # as Prefect's client: Basic auth wins
    assert ts.PrefectAPI(ECHO_API, "TEAM_PREFECT_KEY").headers == {"Authorization": "Basic YWRtaW46cGFzcw=="}
    with pytest.raises(SpecError, match=r"cfg\['api_key_env'\]: the variable \$MISSING_KEY is not set"):
        get_runner().run_component(
            "utils.echo", ["--msg", "hi"], "prefect", cfg={"endpoint": ECHO_API, "api_key_env": "MISSING_KEY"}
        )


def _no_api_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API URL in the environment, none in the active profile (the session's harness sets one)."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_PROFILE", raising=False)
    monkeypatch.setenv("PREFECT_PROFILES_PATH", os.devnull)


def test_the_endpoint_defaults_to_the_active_prefect_profile_read_without_importing_prefect(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_api_url(monkeypatch)
    profiles = tmp_path / "profiles.toml"
    profiles.write_text(
        'active = "team"\n[profiles.team]\nPREFECT_API_URL = "http://team.example:4200/api"\n'
        '[profiles.other]\nPREFECT_API_URL = "http://other.example:4200/api"\n'
    )
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(profiles))
    assert ts.default_endpoint() == "http://team.example:4200/api"
    monkeypatch.setenv("PREFECT_PROFILE", "other")  # Prefect's own override of the active profile
    assert ts.default_endpoint() == "http://other.example:4200/api"
    monkeypatch.setenv("PREFECT_API_URL", "http://env.example:4200/api")  # the environment wins
    assert ts.default_endpoint() == "http://env.example:4200/api"
    code = "import sys, torchstep.schedulers.prefect as p; p.default_endpoint(); print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (
            {"endpoint": ECHO_API, "api_key_env": "TEAM_KEY"},
            r"cfg\['api_key_env'\]: the variable \$TEAM_KEY is not set",
        ),
        ({"endpoint": ECHO_API, "auth_string_env": "TEAM_AUTH"}, r"cfg\['auth_string_env'\]: the variable \$TEAM_AUTH"),
        ({}, r"cfg\['endpoint'\]: no Prefect API to submit to"),
    ],
)
def test_the_dry_run_makes_every_check_the_submission_makes(
    monkeypatch: pytest.MonkeyPatch, cfg: dict[str, Any], match: str
) -> None:
    # before: the dry run printed a request that the submission then refused
    _no_api_url(monkeypatch)
    with pytest.raises(SpecError, match=match):
        get_runner().dryrun_component("utils.echo", ["--msg", "hi"], "prefect", cfg=cfg)


def test_torchx_cli_dryrun_shows_the_request() -> None:
    out = _torchx(
        "run", "--dryrun", "-s", "prefect", "-cfg", f"endpoint={ECHO_API},tags=a;b", "utils.echo", "--msg", "hi"
    )
    assert f"POST {ECHO_API}/deployments/" in out and '"tags": [\n  "a",\n  "b"\n ]' in out
    assert '"target": "local"' in out and '"hi"' in out


def test_submit_without_an_endpoint_or_to_a_dead_server_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_api_url(monkeypatch)
    runner = get_runner()
    with pytest.raises(SpecError, match=r"no Prefect API to submit to; fix: .*-cfg endpoint=.*PREFECT_API_URL"):
        runner.run_component("utils.echo", ["--msg", "hi"], "prefect")
    dead = f"http://127.0.0.1:{free_port()}/api"
    with pytest.raises(SchedulerError, match=r"cannot reach the Prefect API at .*fix: start the server"):
        runner.run_component("utils.echo", ["--msg", "hi"], "prefect", cfg={"endpoint": dead})


@pytest.mark.parametrize(
    ("kind", "name", "message", "state", "msg"),
    [
        ("SCHEDULED", "Late", "", AppState.SUBMITTED, "Late"),
        ("PENDING", "Pending", "", AppState.PENDING, "Pending"),
        ("RUNNING", "Running", "", AppState.RUNNING, "Running"),
        ("COMPLETED", "Completed", "All states completed.", AppState.SUCCEEDED, "Completed: All states completed."),
        ("FAILED", "Failed", "boom", AppState.FAILED, "Failed: boom"),
        ("CRASHED", "Crashed", "killed", AppState.FAILED, "Crashed: killed"),
        ("CANCELLING", "Cancelling", "", AppState.CANCELLED, "Cancelling"),
        ("CANCELLED", "Cancelled", "", AppState.CANCELLED, "Cancelled"),
        ("WHATEVER", "New", "", AppState.UNKNOWN, "New"),
    ],
)
def test_describe_maps_prefect_states_to_torchx(
    monkeypatch: pytest.MonkeyPatch, kind: str, name: str, message: str, state: AppState, msg: str
) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")  # no record: looked up by name
    run = {
        "id": "0b5c3a5e-0000-4000-8000-000000000001",
        "state": {"type": kind, "name": name, "message": message},
        "parameters": {"app": {"roles": [{"name": "trainer", "num_replicas": 2}]}},
    }
    monkeypatch.setattr(ts.PrefectAPI, "flow_run", lambda self, ref: run if ref == "train-1a2b3c" else None)
    desc = ts.create_scheduler("t").describe("train-1a2b3c")
    assert desc is not None and desc.state == state and desc.msg == msg
    assert desc.ui_url == "http://127.0.0.1:4200/runs/flow-run/0b5c3a5e-0000-4000-8000-000000000001"
    assert [(r.name, r.num_replicas) for r in desc.roles] == [("trainer", 2)]
    assert [len(r.replicas) for r in desc.roles_statuses] == [2]
    assert ts.create_scheduler("t").describe("other-1a2b3c") is None


def test_ui_url_of_prefect_cloud() -> None:
    api = "https://api.prefect.cloud/api/accounts/a1/workspaces/w2"
    assert ts.ui_url(api, "r3") == "https://app.prefect.cloud/account/a1/workspace/w2/runs/flow-run/r3"


def test_logs_are_split_by_role_and_the_run_lines_go_to_the_first_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    run = {
        "id": "r1",
        "state": {"type": "COMPLETED", "name": "Completed"},
        "parameters": {"app": {"roles": [{"name": "ps"}, {"name": "worker", "num_replicas": 2}]}},
    }
    logs = [
        {"id": str(i), "timestamp": f"2026-01-01T00:00:0{i}+00:00", "message": m}
        for i, m in enumerate(
            [
                "Beginning flow run",
                "[ps/0] ready",
                "[worker/1] step 1\n[worker/0] step 1",
                "torchstep: worker replica 1 SUCCEEDED (exit 0)",
            ]
        )
    ]
    monkeypatch.setattr(ts.PrefectAPI, "flow_run", lambda self, ref: run)
    monkeypatch.setattr(ts.PrefectAPI, "logs", lambda self, run_id, after=None: logs)
    sched = ts.create_scheduler("t")
    assert list(sched.log_iter("x-1a2b3c", "ps")) == ["Beginning flow run\n", "[ps/0] ready\n"]
    # a launcher event names its replica's role: it is that role's line (the one rule, as on Airflow)
    assert list(sched.log_iter("x-1a2b3c", "worker")) == [
        "[worker/1] step 1\n",
        "[worker/0] step 1\n",
        "torchstep: worker replica 1 SUCCEEDED (exit 0)\n",
    ]
    assert list(sched.log_iter("x-1a2b3c", "worker", 1)) == []
    assert list(sched.log_iter("x-1a2b3c", "worker", regex="/0")) == ["[worker/0] step 1\n"]
    with pytest.raises(ValueError, match=r"no role 'trainer'; fix: use one of \['ps', 'worker'\]"):
        list(sched.log_iter("x-1a2b3c", "trainer"))


# -- against a real Prefect server ---------------------------------------------------------
def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in reversed(procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in reversed(procs):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prefect server and the generic flow served as ``torchstep-torchx/torchx``: the API URL."""
    tmp = tmp_path_factory.mktemp("prefect-torchx")
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(tmp / "home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{tmp / 'prefect.db'}",
            "XDG_STATE_HOME": str(tmp / "runner-state"),
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
    )
    procs: list[subprocess.Popen[bytes]] = []
    with open(tmp / "server.log", "wb") as server_log, open(tmp / "serve.log", "wb") as serve_log:
        try:
            procs.append(
                subprocess.Popen(
                    [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                    env=env,
                    stdout=server_log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

            def healthy() -> bool:
                try:
                    return httpx.get(f"{url}/health", timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for(healthy, 180, "the Prefect server to start", interval=0.5)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "torchstep_prefect.torchx_flow", "serve"],
                    env={**env, "PREFECT_API_URL": url, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},
                    stdout=serve_log,
                    stderr=subprocess.STDOUT,
                    cwd=tmp,
                    start_new_session=True,
                )
            )
            wait_for(
                lambda: httpx.get(f"{url}/deployments/name/torchstep-torchx/torchx", timeout=5).status_code == 200,
                120,
                "the served torchstep-torchx/torchx deployment",
                interval=0.5,
            )
            yield url
        finally:
            _stop(procs)


def _torchx(*args: str, env: dict[str, str] | None = None) -> str:
    """``torchx ARGS`` in a process of its own; its stdout + stderr."""
    out = subprocess.run(
        [str(BIN / "torchx"), *args],
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def _final(handle: str, timeout: float = 120) -> Any:
    runner = get_runner()

    def done() -> Any:
        status = runner.status(handle)
        return status if status is not None and status.is_terminal() else None

    return wait_for(done, timeout, f"{handle} to end", interval=0.5)


@pytest.mark.slow
def test_echo_runs_as_a_flow_run_and_status_log_list_work_from_other_processes(api: str, tmp_path: Path) -> None:
    word = f"hi-{uuid.uuid4().hex[:6]}"
    runner = get_runner()
    handle = runner.run_component("utils.echo", ["--msg", word], "prefect", cfg={"endpoint": api})
    assert handle.startswith("prefect://torchx/echo-")
    status = _final(handle)
    assert status.state == AppState.SUCCEEDED, status
    assert status.ui_url.startswith(api.removesuffix("/api") + "/runs/flow-run/")
    lines = list(runner.log_lines(handle, "echo", 0))
    assert f"[echo/0] {word}\n" in lines and "Finished in state Completed()\n" in lines
    assert any(item.app_handle == handle and item.state == AppState.SUCCEEDED for item in runner.list("prefect"))

    # another process, same user: the record gives the endpoint (none in its environment)
    assert "State: SUCCEEDED" in _torchx("status", handle)
    assert f"echo/0 [echo/0] {word}" in _torchx("log", handle)
    # another machine (no record): the flow run is found by name on PREFECT_API_URL
    other = {"XDG_STATE_HOME": str(tmp_path / "elsewhere"), "PREFECT_API_URL": api}
    assert "State: SUCCEEDED" in _torchx("status", handle, env=other)


@pytest.mark.slow
def test_torchx_cancel_stops_every_process_and_a_followed_log_ends(api: str) -> None:
    mark = f"torchx-cancel-{uuid.uuid4().hex[:6]}"
    out = _torchx("run", "-s", "prefect", "-cfg", f"endpoint={api}", SLEEPER, "--mark", mark, "--seconds", "600")
    handle = next(line for line in out.splitlines() if line.startswith("prefect://"))
    wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 3, 120, "the sleeper's processes")
    runner = get_runner()
    assert runner.status(handle).state == AppState.RUNNING  # type: ignore[union-attr]
    # its line written before the cancel (the processes exist a moment before it prints)
    wait_for(
        lambda: any("sleeping 600.0 s" in line for line in runner.log_lines(handle, "sleeper")), 60, "its first line"
    )
    followed: list[str] = []
    follower = threading.Thread(target=lambda: followed.extend(runner.log_lines(handle, "sleeper", should_tail=True)))
    follower.start()

    _torchx("cancel", handle)
    assert _final(handle, 60).state == AppState.CANCELLED
    wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 60, "no process of the cancelled app")
    run_id = ts.records.load("prefect", handle.rsplit("/", 1)[1])["flow_run_id"]  # type: ignore[index]
    wait_for(
        lambda: api_call("GET", f"{api}/flow_runs/{run_id}").json()["state"]["type"] == "CANCELLED", 60, "Cancelled"
    )
    follower.join(timeout=60)
    assert not follower.is_alive(), "log_lines(should_tail=True) did not end with the run"
    assert any("sleeping 600.0 s" in line for line in followed)
    assert any("sleeper replica 0 CANCELLED" in line for line in followed)


@pytest.mark.slow
def test_a_broken_appdef_fails_the_flow_run_at_once_naming_the_field(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    dep = api_call("GET", f"{api}/deployments/name/torchstep-torchx/torchx").json()
    name = f"broken-{uuid.uuid4().hex[:6]}"
    app = {"version": 1, "name": "broken", "roles": [{"name": "w", "image": "", "entrypoint": ["sh", "-c"]}]}
    r = api_call(
        "POST", f"{api}/deployments/{dep['id']}/create_flow_run", json={"name": name, "parameters": {"app": app}}
    )
    assert r.status_code == 201, r.text
    monkeypatch.setenv("PREFECT_API_URL", api)  # no record: found by name
    sched = ts.create_scheduler("t")

    def ended() -> Any:
        desc = sched.describe(name)
        return desc if desc is not None and is_terminal(desc.state) else None

    desc = wait_for(ended, 120, "the broken run", interval=0.5)
    assert desc.state == AppState.FAILED
    assert "SpecError: app.roles[0].entrypoint (target 'local'): must be a string, got list" in desc.msg
    assert api_call("GET", f"{api}/flow_runs/{r.json()['id']}").json()["run_count"] == 1  # never retried


@pytest.mark.slow
def test_submission_errors_against_a_real_server_say_what_to_do(api: str) -> None:
    runner = get_runner()
    with pytest.raises(
        SchedulerError,
        match=r"no deployment 'torchstep-torchx/nope' at .*fix: serve it "
        r"\(`python -m torchstep_prefect.torchx_flow serve --name torchx`",
    ):
        runner.run_component(
            "utils.echo", ["--msg", "hi"], "prefect", cfg={"endpoint": api, "deployment": "torchstep-torchx/nope"}
        )
    with pytest.raises(SchedulerError, match=r"not associated with a work pool.*fix: drop -cfg queue"):
        runner.run_component("utils.echo", ["--msg", "hi"], "prefect", cfg={"endpoint": api, "queue": "gpu"})
    assert runner.list("prefect") == []  # nothing was recorded for the refused submissions


@pytest.mark.slow
def test_a_work_pool_deployment_gets_the_queue_and_tags_and_a_waiting_run_cancels_at_once(api: str) -> None:
    pool = f"pool-{uuid.uuid4().hex[:6]}"
    for path, body in (
        (f"{api}/work_pools/", {"name": pool, "type": "process"}),
        (f"{api}/work_pools/{pool}/queues", {"name": "gpu"}),
    ):
        assert api_call("POST", path, json=body).status_code == 201
    flow_id = api_call("POST", f"{api}/flows/", json={"name": "torchstep-torchx"}).json()["id"]
    r = api_call(
        "POST",
        f"{api}/deployments/",
        json={
            "name": pool,
            "flow_id": flow_id,
            "work_pool_name": pool,
            "entrypoint": "torchstep_prefect.torchx_flow.torchx_app",
        },
    )
    assert r.status_code in (200, 201), r.text
    runner = get_runner()
    handle = runner.run_component(
        "utils.echo",
        ["--msg", "hi"],
        "prefect",
        cfg={"endpoint": api, "deployment": f"torchstep-torchx/{pool}", "queue": "gpu", "tags": ["nightly"]},
    )
    record = ts.records.load("prefect", handle.rsplit("/", 1)[1])
    run = api_call("GET", f"{api}/flow_runs/{record['flow_run_id']}").json()  # type: ignore[index]
    assert run["work_queue_name"] == "gpu" and "nightly" in run["tags"]
    assert runner.status(handle).state == AppState.SUBMITTED  # type: ignore[union-attr]  # no worker polls the pool
    runner.cancel(handle)
    assert runner.status(handle).state == AppState.CANCELLED  # type: ignore[union-attr]
    assert api_call("GET", f"{api}/flow_runs/{run['id']}").json()["state"]["type"] == "CANCELLED"


@pytest.mark.slow
def test_a_busy_server_and_a_lost_answer_neither_fail_nor_repeat_a_submission(api: str) -> None:
    proxy = FaultyProxy(api)  # between the scheduler and the real server
    try:
        proxy.busy(2, retry_after="1")  # 503 while the server's SQLite is busy: waited for
        proxy.lose_answer("POST", r"/create_flow_run$")  # the run is made, its answer never arrives
        runner = get_runner()
        handle = runner.run_component("utils.echo", ["--msg", "once"], "prefect", cfg={"endpoint": proxy.url})
        app_id = handle.rsplit("/", 1)[1]
        assert [what for _, _, what in proxy.log[:2]] == ["busy", "busy"]
        creates = [what for _, path, what in proxy.log if path.endswith("/create_flow_run")]
        creates = [what for what in creates if what != "503"]  # the real server's own busy answers, waited for
        assert creates == ["answer 201 lost", "200"]  # retried with the same idempotency key: the same run
        body = {"flow_runs": {"name": {"any_": [app_id]}}}
        runs = api_call("POST", f"{api}/flow_runs/filter", json=body).json()
        assert len(runs) == 1 and ts.records.load("prefect", app_id)["flow_run_id"] == runs[0]["id"]  # type: ignore[index]
        proxy.busy(1)
        assert _final(handle).state == AppState.SUCCEEDED  # status through the proxy, busy once more
    finally:
        proxy.close()
