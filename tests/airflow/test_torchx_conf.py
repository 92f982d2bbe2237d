"""The ``airflow`` TorchX scheduler without a server: the dry run is the DAG run request,
the generic DAG's conf is checked field by field, options name the fix."""

import json

import pytest
import torchstep
from torchstep.errors import SpecError
from torchx.runner import get_runner


@pytest.fixture()
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHSTEP_AIRFLOW_ENDPOINT", raising=False)
    with get_runner() as r:
        yield r


def test_the_dry_run_is_the_dag_run_request_with_the_appdef_as_conf(runner):
    info = runner.dryrun_component(
        "utils.echo",
        ["--msg", "$(id) {{ ds }}"],
        "airflow",
        cfg={"endpoint": "http://af:8080", "queue": "gpu", "step_cfg": {"grace_period": "5"}},
    )
    text = str(info)
    first, body = text.split("\n", 1)
    assert first == "POST http://af:8080/api/v2/dags/torchstep_torchx_gpu/dagRuns"
    req = json.loads(body)
    assert req["logical_date"] is None and req["dag_run_id"].startswith("echo-")
    assert req["conf"]["app"]["roles"][0]["args"] == ["$(id) {{ ds }}"]
    assert req["conf"]["cfg"] == {"grace_period": "5"} and req["conf"]["target"] == "local"
    from torchstep_airflow.torchx_dag import app_from_conf

    app, target, cfg = app_from_conf(req["conf"])  # what the generic DAG's task does with it
    assert app.roles[0].args == ["$(id) {{ ds }}"] and target == "local" and cfg == {"grace_period": "5"}


def test_secrets_never_reach_the_request_or_the_record(runner, monkeypatch):
    monkeypatch.setenv("AIRFLOW_API_TOKEN", "s3cr3t-token-value")
    info = runner.dryrun_component("utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": "http://af:8080"})
    assert "s3cr3t" not in str(info) and "s3cr3t" not in json.dumps(info.request.api)
    assert info.request.api["token_env"] == "AIRFLOW_API_TOKEN"


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        ({}, r"cfg\['endpoint'\].*fix: -cfg endpoint="),
        ({"endpoint": "http://a", "target": "k8s"}, r"cfg\['target'\]"),
        ({"endpoint": "http://a", "namespace": "ml"}, r"cfg\['namespace'\].*only the kubernetes target"),
        ({"endpoint": "http://a", "dag_idd": "x"}, r"cfg\['dag_idd'\].*unknown option"),
    ],
)
def test_bad_options_name_the_option_and_the_fix(runner, cfg, match):
    with pytest.raises(ValueError, match=match):
        runner.dryrun_component("utils.echo", ["--msg", "x"], "airflow", cfg=cfg)


def test_an_appdef_the_target_cannot_run_is_refused_before_submitting(runner):
    app = torchstep.materialize("utils.echo", ["--msg", "x"])
    app.roles[0].env["A B"] = "1"
    with pytest.raises(SpecError, match=r"roles\[0\]\.env\['A B'\].*fix"):
        runner.dryrun(app, "airflow", cfg={"endpoint": "http://a"})


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        (None, "conf['app']"),
        ({}, "conf['app']"),
        ({"app": {}, "extra": 1}, "conf['extra']"),
        ({"app": {}, "target": "ssh"}, "conf['target']"),
        ({"app": {}, "cfg": "timeout=1"}, "conf['cfg']"),
        (
            {"app": {"version": 1, "name": "x", "roles": [{"name": "w", "image": "", "entrypoint": "e", "env": []}]}},
            "conf['app'].roles[0].env",
        ),
    ],
)
def test_the_generic_dag_checks_its_conf_and_names_the_field(conf, field):
    from torchstep_airflow.torchx_dag import app_from_conf

    with pytest.raises(SpecError) as err:
        app_from_conf(conf)
    assert err.value.field == field and err.value.fix


def test_task_log_lines_go_to_the_role_they_name_and_airflow_lines_to_the_first_role():
    from torchstep.schedulers.base import lines_of_role

    roles = ["trainer", "ps"]

    def belongs(line: str, role: str) -> bool:
        return list(lines_of_role([line], role, roles)) == [line]

    assert belongs("[trainer/3] loss 0.1", "trainer")
    assert not belongs("[trainer/3] loss 0.1", "ps")
    assert belongs("torchstep: ps replica 0 SUCCEEDED", "ps")
    assert belongs("Task failed with exception", "trainer")
    assert not belongs("Task failed with exception", "ps")


def test_the_agents_informational_lines_are_left_in_its_log_its_errors_stay_with_the_app():
    from torchstep.schedulers.base import lines_of_role

    lines = [
        "[torchstep-agent 2026-11-25 11:54:43,185 INFO] torchstep-agent effective settings: nnodes 1:1",
        "[trainer/0] loss 0.1",
        "[torchstep-agent 2026-11-25 11:54:43,434 ERROR] FAILED (exit 1, restarts 0): rank 0 worker_failed",
        "Task failed with exception",
    ]
    assert list(lines_of_role(lines, "trainer", ["trainer"])) == lines[1:]


def test_an_endpoint_with_credentials_is_refused_without_repeating_them(runner):
    with pytest.raises(ValueError, match=r"cfg\['endpoint'\].*no credentials.*not shown.*token_env") as err:
        runner.dryrun_component(
            "utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": "http://admin:hunter2@af:8080"}
        )
    assert "hunter2" not in str(err.value)


def test_list_leaves_out_an_app_whose_airflow_is_down_and_lists_the_rest(runner):
    from netlib import free_port
    from torchstep.schedulers import records

    down = f"http://127.0.0.1:{free_port()}"
    records.save(
        "airflow",
        "torchstep_torchx:gone-1",
        {"endpoint": down, "dag_id": "torchstep_torchx", "dag_run_id": "gone-1", "api": {"timeout": 2.0}},
    )
    assert runner.list("airflow") == []  # no traceback: the deployment is down, nothing else to list
    with pytest.raises(RuntimeError, match="cannot reach the Airflow API"):
        runner.status("airflow://torchx/torchstep_torchx:gone-1")


class _Refusing:
    """An HTTP server on 127.0.0.1 that refuses every request (401) and counts them."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        server = self
        self.requests: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                server.requests.append(f"{self.command} {self.path}")
                self.send_response(401)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_POST = do_PATCH = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def __enter__(self) -> "_Refusing":
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


TOKEN = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZGEifQ.c2VjcmV0LXNpZw"


@pytest.mark.parametrize(
    ("cfg", "key"), [({"token_env": TOKEN}, "token_env"), ({"username": "ada", "password_env": TOKEN}, "password_env")]
)
def test_a_secret_given_for_a_credential_variable_is_refused_never_sent_shown_or_stored(runner, tmp_path, cfg, key):
    from torchstep.schedulers import records

    with _Refusing() as server:
        with pytest.raises(SpecError) as err:
            runner.run_component("utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": server.url, **cfg})
    assert err.value.field == f"cfg['{key}']" and "NAME of an environment variable" in str(err.value)
    assert TOKEN not in str(err.value) and "not shown" in str(err.value) and err.value.fix
    assert server.requests == []  # nothing sent
    assert records.app_ids("airflow") == []  # nothing stored


def test_a_named_credential_variable_that_is_not_set_is_said_before_anything_is_sent(runner, monkeypatch):
    monkeypatch.delenv("TEAM_AIRFLOW_TOKEN", raising=False)
    monkeypatch.delenv("AIRFLOW_PASSWORD", raising=False)
    with _Refusing() as server:
        with pytest.raises(SpecError, match=r"cfg\['token_env'\]: the variable \$TEAM_AIRFLOW_TOKEN is not set"):
            runner.run_component(
                "utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": server.url, "token_env": "TEAM_AIRFLOW_TOKEN"}
            )
        with pytest.raises(
            SpecError, match=r"cfg\['username'\]: needs its password in \$AIRFLOW_PASSWORD.*fix: export"
        ):
            runner.dryrun_component(
                "utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": server.url, "username": "ada"}
            )
        monkeypatch.setenv("TEAM_AIRFLOW_TOKEN", "t0ken-value")  # set: the API decides, and says so without it
        with pytest.raises(RuntimeError, match=r"refused the credentials .*HTTP 401.*\$TEAM_AIRFLOW_TOKEN") as err:
            runner.run_component(
                "utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": server.url, "token_env": "TEAM_AIRFLOW_TOKEN"}
            )
        assert "t0ken-value" not in str(err.value) and len(server.requests) == 1


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-5"])
def test_a_timeout_that_is_not_a_number_of_seconds_is_one_line_and_nothing_is_sent(runner, timeout):
    with _Refusing() as server:
        with pytest.raises(SpecError) as err:
            runner.run_component(
                "utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": server.url, "timeout": float(timeout)}
            )
        assert server.requests == []
    assert str(err.value).startswith("cfg['timeout']: must be a positive, finite number of seconds")
    assert "\n" not in str(err.value) and "fix: e.g. -cfg timeout=30" in str(err.value)


def test_the_cli_says_what_is_wrong_with_timeout_nan_not_a_socket_error(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    torchx = str(Path(sys.executable).with_name("torchx"))
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path)}
    with _Refusing() as server:
        out = subprocess.run(
            [torchx, "run", "-s", "airflow", "-cfg", f"endpoint={server.url},timeout=nan", "utils.echo", "--msg", "x"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert server.requests == []
    assert out.returncode != 0 and "socket.py" not in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (  # one line under torchx's CLI, not a traceback
        "torchx: error: cfg['timeout']: must be a positive, finite number of seconds, got nan; "
        "fix: e.g. -cfg timeout=30"
    )


@pytest.mark.parametrize(
    ("cfg", "field"),
    [
        ({"step_cfg": {"grace_perod": "5"}}, "cfg['step_cfg']['grace_perod']"),
        ({"step_cfg": {"timeout": "nan"}}, "cfg['step_cfg']['timeout']"),
        ({"step_cfg": {"run_id": "mine"}}, "cfg['step_cfg']['run_id']"),
        ({"target": "kubernetes", "step_cfg": {"shm_size": "lots"}}, "cfg['step_cfg']['shm_size']"),
        ({"target": "kubernetes", "namespace": "ml", "step_cfg": {"namespace": "other"}}, "cfg['namespace']"),
        ({"dag_id": "torchstep torchx"}, "cfg['dag_id']"),
        ({"queue": "gpu/a"}, "cfg['queue']"),
    ],
)
def test_the_dry_run_checks_step_cfg_for_its_target_as_the_task_will(runner, cfg, field):
    # before: the dry run printed the request, the DAG run was triggered and failed in Airflow
    with pytest.raises(SpecError) as err:
        runner.dryrun_component("utils.echo", ["--msg", "x"], "airflow", cfg={"endpoint": "http://af:8080", **cfg})
    assert err.value.field == field and err.value.fix
