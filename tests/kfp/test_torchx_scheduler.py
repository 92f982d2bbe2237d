"""``torchx run -s kfp`` (torchstep_kfp.torchx_scheduler) against a FAKE of the KFP API.

No KFP server can run on these machines. ``FakeKfp`` below is test code: a small local HTTP
server that serves the KFP v2beta1 REST paths that ``kfp.Client`` 2.16.1 (with
``kfp-server-api``) actually calls — ``GET /apis/v2beta1/healthz``, ``GET|POST
/apis/v2beta1/experiments``, ``POST|GET /apis/v2beta1/runs``, ``GET
/apis/v2beta1/runs/{id}``, ``POST /apis/v2beta1/runs/{id}:terminate`` — with JSON bodies
shaped like the real API's (field names of the ``kfp_server_api`` models, which
``test_fake_speaks_the_client_models`` checks; errors as grpc-gateway writes them). It
records every request so the tests assert on what the scheduler sent. What a real server
does with the run (Argo, pods, the step itself) is not tested here.
"""

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from netlib import free_port
from torchstep import SpecError
from torchx import specs
from torchx.specs import AppState

pytest.importorskip("kfp")
from torchstep.components.appjson import app_to_dict  # noqa: E402
from torchstep.schedulers.base import SchedulerError  # noqa: E402
from torchstep_kfp import torchx_scheduler as ks  # noqa: E402

TOKEN = "tok-3c9f1e7a5b2d4f60a8e1c7d9b3f5a2e4"  # the secret that must never be written anywhere
BIN = Path(sys.executable).parent
NOW = "2026-11-24T12:00:00Z"


class FakeKfp:
    """Test fake of the KFP v2beta1 REST API (see the module docstring)."""

    def __init__(self, *, token: str | None = None, multi_user: bool = False) -> None:
        self.token, self.multi_user = token, multi_user
        self.requests: list[dict[str, Any]] = []
        self.runs: dict[str, dict[str, Any]] = {}
        self.experiments: dict[str, dict[str, Any]] = {}
        self.healthz_html = False
        self._n = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake._serve(self, "GET")

            def do_POST(self) -> None:
                fake._serve(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def _id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n:04d}-2d5c-4a8e-9f3a-7c1d2e3f4a5b"

    def add_run(self, state: str, error: str | None = None, **fields: Any) -> str:
        run_id = self._id("0b6f")
        self.runs[run_id] = {
            "run_id": run_id,
            "display_name": f"r-{run_id[:8]}",
            "experiment_id": "e",
            "storage_state": "AVAILABLE",
            "created_at": NOW,
            "scheduled_at": NOW,
            "state": state,
            "state_history": [{"update_time": NOW, "state": state}],
            **fields,
        }
        if error:
            self.runs[run_id]["error"] = {"code": 2, "message": error, "details": []}
        return run_id

    def _serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(h.path)
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append(
            {
                "method": method,
                "path": url.path,
                "query": query,
                "body": body,
                "authorization": h.headers.get("Authorization"),
            }
        )
        status, out = self._route(method, url.path, query, body, h.headers.get("Authorization"))
        data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
        h.send_response(status)
        h.send_header("Content-Type", "text/html" if isinstance(out, str) else "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _error(status: int, code: int, message: str) -> tuple[int, dict[str, Any]]:
        return status, {"error": message, "code": code, "message": message, "details": []}

    def _route(self, method: str, path: str, query: dict[str, str], body: Any, auth: str | None) -> tuple[int, Any]:
        if path == "/apis/v2beta1/healthz" and self.healthz_html:
            return 200, "<html><body>Sign in</body></html>"  # an auth proxy's login page
        if self.token and auth != f"Bearer {self.token}":
            return self._error(401, 16, "Unauthenticated: invalid bearer token")
        if path == "/apis/v2beta1/healthz":
            return 200, {"multi_user": self.multi_user, "pipeline_store": "database"}
        if path == "/apis/v2beta1/experiments" and method == "GET":
            wanted = [p["stringValue"] for p in json.loads(query.get("filter", "{}")).get("predicates", [])]
            found = [e for e in self.experiments.values() if e["display_name"] in wanted or not wanted]
            return 200, {"experiments": found, "total_size": len(found)} if found else {}
        if path == "/apis/v2beta1/experiments" and method == "POST":
            exp_id = self._id("e1a2")
            self.experiments[exp_id] = {
                **body,
                "experiment_id": exp_id,
                "created_at": NOW,
                "storage_state": "AVAILABLE",
                "last_run_created_at": "1970-01-01T00:00:00Z",
            }
            return 200, self.experiments[exp_id]
        if path == "/apis/v2beta1/runs" and method == "POST":
            run_id = self.add_run("PENDING")
            self.runs[run_id].update({k: v for k, v in body.items() if v is not None})
            return 200, self.runs[run_id]
        if path == "/apis/v2beta1/runs" and method == "GET":
            return 200, {"runs": list(self.runs.values()), "total_size": len(self.runs)}
        m = re.fullmatch(r"/apis/v2beta1/runs/([^/:]+)(:terminate)?", path)
        if m and m[1] not in self.runs:
            return self._error(404, 5, f"Failed to get run: ResourceNotFoundError: Run {m[1]} not found")
        if m and m[2] and method == "POST":
            self.runs[m[1]]["state"] = "CANCELING"
            return 200, {}
        if m and method == "GET":
            return 200, self.runs[m[1]]
        return self._error(404, 5, f"Not Found: {method} {path}")

    def sent(self, method: str, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["method"] == method and r["path"] == path]


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private state directory (the records) and no KFP settings from the machine."""
    for name in (
        ks.ENDPOINT_ENV,
        ks.UI_ENDPOINT_ENV,
        ks.EXPERIMENT_ENV,
        ks.TOKEN_ENV,
        "KFP_OTHER_TOKEN",
        "KF_PIPELINES_OVERRIDE_EXPERIMENT_NAME",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


@pytest.fixture
def fake(env: Path) -> Iterator[FakeKfp]:
    server = FakeKfp(token=TOKEN)
    yield server
    server.server.shutdown()


def echo_app(*args: str) -> specs.AppDef:
    role = specs.Role(
        "echo",
        image="ghcr.io/acme/torchstep:1",
        entrypoint="echo",
        args=list(args or ["hi"]),
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    return specs.AppDef("echo", roles=[role])


def cfg(fake: FakeKfp, **extra: Any) -> dict[str, Any]:
    return {"endpoint": fake.url, "token_env": ks.TOKEN_ENV, **extra}


def submit(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch, **extra: Any) -> tuple[ks.KfpScheduler, str]:
    monkeypatch.setenv(ks.TOKEN_ENV, TOKEN)
    sched = ks.create_scheduler("torchx")
    return sched, sched.submit(echo_app(), cfg(fake, **extra))


def only(mapping: dict[str, Any]) -> Any:
    (value,) = mapping.values()
    return value


def test_runopts_and_cheap_import(env: Path) -> None:
    names = set(ks.create_scheduler("s").run_opts()._opts)
    assert {"endpoint", "token_env", "namespace", "experiment", "image", "launcher_image", "caching"} <= names
    code = "import sys, torchstep_kfp.torchx_scheduler; print('kfp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # `torchx runopts` does not pay for kfp's import


def test_dryrun_prints_the_compiled_one_step_pipeline(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ks.TOKEN_ENV, TOKEN)
    app = echo_app("hello", "{{not a placeholder}}")
    info = ks.create_scheduler("torchx").submit_dryrun(
        app, {"endpoint": "https://kfp.example.com/", "namespace": "team-a", "experiment": "nightly"}
    )
    text = str(info)
    assert TOKEN not in text
    head = [line for line in text.splitlines() if line.startswith("# kfp ")]
    assert re.fullmatch(r"# kfp run: echo-[a-z0-9]{6}", head[0])
    assert head[1:5] == [
        "# kfp experiment: nightly",
        "# kfp namespace: team-a",
        "# kfp endpoint: https://kfp.example.com",
        f"# kfp token: ${ks.TOKEN_ENV}",
    ]
    pipeline, platform = yaml.safe_load_all(text)
    assert pipeline["pipelineInfo"]["name"] == "echo"
    task = only(pipeline["root"]["dag"]["tasks"])
    assert task["cachingOptions"] == {}  # caching off by default
    container = only(pipeline["deploymentSpec"]["executors"])["container"]
    assert container["command"] == ["python3", "-m", "torchstep_kfp.entry"]
    assert container["image"] == "ghcr.io/acme/torchstep:1"
    step = json.loads(container["args"][container["args"].index("--spec") + 1])
    assert step["app"] == app_to_dict(app)
    assert container["resources"]["resourceMemoryLimit"] == "512Mi"
    assert "kubernetes" in platform["platforms"]


def test_dryrun_options_image_and_caching(env: Path) -> None:
    info = ks.create_scheduler("torchx").submit_dryrun(
        echo_app(), {"endpoint": "http://kfp:8888", "image": "ghcr.io/acme/other:2", "caching": True}
    )
    pipeline = next(yaml.safe_load_all(str(info)))
    assert only(pipeline["deploymentSpec"]["executors"])["container"]["image"] == "ghcr.io/acme/other:2"
    assert only(pipeline["root"]["dag"]["tasks"])["cachingOptions"] == {"enableCache": True}
    assert "# kfp token: (none)" in str(info) and "# kfp experiment: Default" in str(info)


def test_schedule_creates_the_run_and_a_record(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch, env: Path) -> None:
    sched, app_id = submit(fake, monkeypatch, namespace="team-a", experiment="nightly", service_account="runner")
    assert ks.records.check_app_id(app_id) == app_id and app_id in fake.runs
    assert all(r["authorization"] == f"Bearer {TOKEN}" for r in fake.requests)
    (exp,) = fake.sent("POST", "/apis/v2beta1/experiments")
    assert exp["body"] == {"display_name": "nightly", "namespace": "team-a"}
    (create,) = fake.sent("POST", "/apis/v2beta1/runs")
    body = create["body"]
    assert re.fullmatch(r"echo-[a-z0-9]{6}", body["display_name"])
    assert body["experiment_id"] == fake.experiments[next(iter(fake.experiments))]["experiment_id"]
    assert body["service_account"] == "runner"
    spec = body["pipeline_spec"]["pipeline_spec"]  # with the kubernetes platform spec beside it
    container = only(spec["deploymentSpec"]["executors"])["container"]
    assert json.loads(container["args"][container["args"].index("--spec") + 1])["app"] == app_to_dict(echo_app())
    assert "kubernetes" in body["pipeline_spec"]["platform_spec"]["platforms"]

    record_file = env / "state" / "torchstep" / "torchx" / "kfp" / f"{app_id}.json"
    record = json.loads(record_file.read_text())
    assert record["endpoint"] == fake.url and record["run_id"] == app_id and record["namespace"] == "team-a"
    assert record["token_env"] == ks.TOKEN_ENV and record["run_name"] == body["display_name"]
    assert oct(record_file.stat().st_mode & 0o777) == "0o600"
    assert TOKEN not in record_file.read_text()
    # a second submission reuses the experiment
    sched.submit(echo_app(), cfg(fake, namespace="team-a", experiment="nightly"))
    assert len(fake.sent("POST", "/apis/v2beta1/experiments")) == 1


@pytest.mark.parametrize(
    ("kfp_state", "expected"),
    [
        ("PENDING", AppState.PENDING),
        ("RUNNING", AppState.RUNNING),
        ("SUCCEEDED", AppState.SUCCEEDED),
        ("SKIPPED", AppState.SUCCEEDED),
        ("FAILED", AppState.FAILED),
        ("CANCELING", AppState.CANCELLED),
        ("CANCELED", AppState.CANCELLED),
        ("PAUSED", AppState.PENDING),
        ("RUNTIME_STATE_UNSPECIFIED", AppState.UNKNOWN),
    ],
)
def test_describe_maps_each_kfp_state(
    fake: FakeKfp, monkeypatch: pytest.MonkeyPatch, kfp_state: str, expected: AppState
) -> None:
    sched, app_id = submit(fake, monkeypatch)
    fake.runs[app_id]["state"] = kfp_state
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == expected
    assert desc.ui_url == f"{fake.url}/#/runs/details/{app_id}"
    assert [r.name for r in desc.roles] == ["echo"]
    assert [(r.role, [rep.state for rep in r.replicas]) for r in desc.roles_statuses] == [("echo", [expected])]


def test_describe_failed_run_carries_kfp_error_and_unknown_run_is_none(
    fake: FakeKfp, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched, app_id = submit(fake, monkeypatch, ui_endpoint="https://ui.example.com")
    fake.runs[app_id].update(state="FAILED", error={"code": 2, "message": "task echo failed: exit 3", "details": []})
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.FAILED and desc.msg == "task echo failed: exit 3"
    assert desc.ui_url == f"https://ui.example.com/#/runs/details/{app_id}"
    monkeypatch.setenv(ks.ENDPOINT_ENV, fake.url)  # no record: this endpoint, which answers 404
    assert sched.describe("0b6f9999-2d5c-4a8e-9f3a-7c1d2e3f4a5b") is None
    assert sched.describe("../etc/passwd") is None


def test_cancel_terminates_the_run(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch) -> None:
    sched, app_id = submit(fake, monkeypatch)
    sched.cancel(app_id)
    assert len(fake.sent("POST", f"/apis/v2beta1/runs/{app_id}:terminate")) == 1
    desc = sched.describe(app_id)
    assert desc is not None and desc.state == AppState.CANCELLED and "CANCELING" in desc.msg
    monkeypatch.setenv(ks.ENDPOINT_ENV, fake.url)
    sched.cancel("0b6f9999-2d5c-4a8e-9f3a-7c1d2e3f4a5b")  # unknown there (404): nothing to terminate
    assert not fake.sent("POST", "/apis/v2beta1/runs/0b6f9999-2d5c-4a8e-9f3a-7c1d2e3f4a5b:terminate")


def test_list_gives_the_recorded_runs_with_their_state(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch) -> None:
    sched, first = submit(fake, monkeypatch)
    second = sched.submit(echo_app(), cfg(fake))
    fake.runs[first]["state"] = "SUCCEEDED"
    fake.runs[second]["state"] = "RUNNING"
    fake.add_run("RUNNING")  # someone else's run on the same KFP: not ours
    assert {(r.app_id, r.state) for r in sched.list()} == {(first, AppState.SUCCEEDED), (second, AppState.RUNNING)}


def test_another_process_uses_the_record_or_the_environment(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch) -> None:
    _, app_id = submit(fake, monkeypatch, namespace="team-a")
    fake.runs[app_id]["state"] = "RUNNING"
    # a new scheduler (as `torchx status` in another shell): the endpoint comes from the record
    desc = ks.create_scheduler("torchx").describe(app_id)
    assert desc is not None and desc.state == AppState.RUNNING
    # a run submitted elsewhere: no record, so $KF_PIPELINES_ENDPOINT
    other = fake.add_run("SUCCEEDED", pipeline_spec={"pipeline_spec": {}, "platform_spec": {}})
    with pytest.raises(SchedulerError, match=r"no record\) and \$KF_PIPELINES_ENDPOINT is unset; fix: export"):
        ks.create_scheduler("torchx").describe(other)
    monkeypatch.setenv(ks.ENDPOINT_ENV, fake.url)
    desc = ks.create_scheduler("torchx").describe(other)
    assert desc is not None and desc.state == AppState.SUCCEEDED and desc.roles == []
    # the token variable must exist where the record is used
    monkeypatch.delenv(ks.TOKEN_ENV)
    with pytest.raises(SchedulerError, match=r"token variable \$KF_PIPELINES_TOKEN is not set.*fix: export"):
        ks.create_scheduler("torchx").describe(app_id)


def test_torchx_cli_run_status_and_log(fake: FakeKfp, env: Path) -> None:
    """The real `torchx` commands, each in its own process, through the entry point."""
    run_env = {**os.environ, ks.TOKEN_ENV: TOKEN}
    cmd = [
        str(BIN / "torchx"),
        "run",
        "-s",
        "kfp",
        "-cfg",
        f"endpoint={fake.url},namespace=team-a",
        "utils.echo",
        "--image",
        "ghcr.io/acme/torchstep:1",
        "--msg",
        "hi",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=run_env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert re.fullmatch(r"kfp://torchx/0b6f\d{4}-[-0-9a-f]+", out.stdout.strip())  # only the handle on stdout
    handle = out.stdout.strip()
    app_id = handle.rsplit("/", 1)[1]
    fake.runs[app_id].update(state="FAILED", error={"code": 2, "message": "echo exited 1", "details": []})
    status = subprocess.run(
        [str(BIN / "torchx"), "status", handle], capture_output=True, text=True, env=run_env, timeout=120
    )
    assert status.returncode == 0, status.stderr
    assert "FAILED" in status.stdout + status.stderr and "echo exited 1" in status.stdout + status.stderr
    log = subprocess.run(
        [str(BIN / "torchx"), "log", f"{handle}/echo/0"], capture_output=True, text=True, env=run_env, timeout=120
    )
    assert log.returncode != 0
    assert f"kubectl logs -n team-a -l pipeline/runid={app_id} -c main" in log.stderr
    assert TOKEN not in out.stdout + out.stderr + status.stdout + status.stderr + log.stderr


def test_log_iter_says_where_the_logs_are(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch) -> None:
    sched, app_id = submit(fake, monkeypatch)
    with pytest.raises(NotImplementedError) as err:
        sched.log_iter(app_id, "echo")
    text = str(err.value)
    assert f"kubectl logs -n kubeflow -l pipeline/runid={app_id} -c main --prefix --tail=-1" in text
    assert f"{fake.url}/#/runs/details/{app_id}" in text and "\n" not in text


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"endpoint": "kfp.example.com"}, r"cfg\['endpoint'\].*not an http\(s\) URL.*fix: -cfg endpoint="),
        ({"endpoint": "https://ada:hunter2@kfp.example.com"}, r"cfg\['endpoint'\].*with credentials, not shown"),
        ({"token_env": "eyJhbGciOi.J9.xyz"}, r"cfg\['token_env'\].*NAME of an environment variable.*not shown"),
        ({"token_env": "KFP_OTHER_TOKEN"}, r"cfg\['token_env'\].*\$KFP_OTHER_TOKEN is not set.*fix: export"),
        ({"token_env": "ghp_16C7e42F292c6912E7710c838347Ae178B4a"}, r"token_env.*named by token_env \(not shown\)"),
        ({"namespace": "Team A"}, r"cfg\['namespace'\].*not a Kubernetes namespace.*fix:"),
        ({"namspace": "team-a"}, r"cfg\['namspace'\].*not an option of the kfp scheduler.*fix: use one of"),
    ],
)
def test_bad_cfg_is_one_clear_line(env: Path, given: dict[str, Any], message: str) -> None:
    cfg = {"endpoint": "https://kfp.example.com", **given} if given else {}
    with pytest.raises(SpecError, match=message) as err:
        ks.create_scheduler("torchx").submit_dryrun(echo_app(), cfg)
    text = str(err.value)
    assert "\n" not in text and "hunter2" not in text and "eyJhbGciOi" not in text and "ghp_16C7" not in text


def test_a_dry_run_needs_no_endpoint_a_submission_does(env: Path) -> None:
    sched = ks.create_scheduler("torchx")
    shown = str(sched.submit_dryrun(echo_app(), {}))  # `torchx run --dryrun -s kfp` with no endpoint anywhere
    assert f"# kfp endpoint: (none yet: a submission needs -cfg endpoint=... or ${ks.ENDPOINT_ENV})" in shown
    assert "pipelineInfo" in shown
    with pytest.raises(SpecError, match=r"cfg\['endpoint'\] .*no KFP endpoint.*fix: -cfg endpoint=https://") as err:
        sched.submit(echo_app(), {})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"token_env": "KFP_OTHER_TOKEN"}, "cfg['token_env']"),
        ({"service_account": "Pipeline_Runner"}, "cfg['service_account']"),
        ({"pipeline_root": "gs://bucket/a b"}, "cfg['pipeline_root']"),
        ({"experiment": "nightly\nrun"}, "cfg['experiment']"),
        ({"launcher_image": "ghcr.io/a b:1"}, "cfg['launcher_image']"),
        ({"image": ""}, "cfg['image']"),
        ({"ui_endpoint": "ui.example.com"}, "cfg['ui_endpoint']"),
    ],
)
def test_the_dry_run_makes_every_check_the_submission_makes(
    fake: FakeKfp, monkeypatch: pytest.MonkeyPatch, given: dict[str, Any], field: str
) -> None:
    monkeypatch.setenv(ks.TOKEN_ENV, TOKEN)
    sched = ks.create_scheduler("torchx")
    with pytest.raises(SpecError) as dry:
        sched.submit_dryrun(echo_app(), cfg(fake, **given))
    with pytest.raises(SpecError) as real:
        sched.submit(echo_app(), cfg(fake, **given))
    assert dry.value.field == real.value.field == field and str(dry.value) == str(real.value)
    assert fake.requests == []  # refused before anything was sent


def test_an_appdef_kfp_cannot_express(env: Path) -> None:
    app = echo_app()
    app.roles[0].mounts = [specs.BindMount(src_path="/data", dst_path="/data")]
    with pytest.raises(SpecError, match=r"roles\[0\]\.mounts\[0\] \(target 'kfp'\).*fix:"):
        ks.create_scheduler("torchx").submit_dryrun(app, {"endpoint": "https://kfp.example.com"})


def test_endpoint_errors(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch) -> None:
    sched = ks.create_scheduler("torchx")
    down = {"endpoint": f"http://127.0.0.1:{free_port()}"}
    with pytest.raises(SchedulerError, match=r"is unreachable \(health check.*fix: check -cfg endpoint"):
        sched.submit(echo_app(), down)
    with pytest.raises(SchedulerError, match=r"refused health check \(HTTP 401\): Unauthenticated.*check the token"):
        sched.submit(echo_app(), {"endpoint": fake.url})  # no token
    monkeypatch.setenv("KFP_OTHER_TOKEN", "wrong-token")
    with pytest.raises(SchedulerError, match=r"HTTP 401.*\$KFP_OTHER_TOKEN"):
        sched.submit(echo_app(), {"endpoint": fake.url, "token_env": "KFP_OTHER_TOKEN"})
    fake.healthz_html = True
    monkeypatch.setenv(ks.TOKEN_ENV, TOKEN)
    with pytest.raises(SchedulerError, match=r"did not answer as the KFP API.*a login page"):
        ks.create_scheduler("torchx").submit(echo_app(), cfg(fake))
    assert not fake.sent("POST", "/apis/v2beta1/runs")


def test_fake_speaks_the_client_models(fake: FakeKfp, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field the fake answers with is a field of the kfp_server_api model the client
    reads it into (so the recorded shapes are the API's, not ours)."""
    import kfp_server_api.models as m

    _, app_id = submit(fake, monkeypatch)
    models = [
        (fake.runs[app_id], m.V2beta1Run),
        (next(iter(fake.experiments.values())), m.V2beta1Experiment),
        (fake.runs[app_id]["state_history"][0], m.V2beta1RuntimeStatus),
        ({"multi_user": False, "pipeline_store": "database"}, m.V2beta1GetHealthzResponse),
    ]
    for data, model in models:
        assert set(data) <= set(model.attribute_map.values()), model.__name__
    assert fake.runs[app_id]["state"] in m.V2beta1RuntimeState.allowable_values
    assert set(ks.STATES) | {"RUNTIME_STATE_UNSPECIFIED"} == set(m.V2beta1RuntimeState.allowable_values)
