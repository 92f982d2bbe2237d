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
    info = runner.dryrun_component("utils.echo", ["--msg", "$(id) {{ ds }}"], "airflow",
                                   cfg={"endpoint": "http://af:8080", "queue": "gpu", "step_cfg": {"grace_period": "5"}})  # fmt: skip
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
        ({"app": {"version": 1, "name": "x", "roles": [{"name": "w", "image": "", "entrypoint": "e", "env": []}]}},
         "conf['app'].roles[0].env"),
    ],
)  # fmt: skip
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
    assert belongs("torchstep: ps/0 SUCCEEDED", "ps")
    assert belongs("Task failed with exception", "trainer")
    assert not belongs("Task failed with exception", "ps")


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
    records.save("airflow", "torchstep_torchx:gone-1", {"endpoint": down, "dag_id": "torchstep_torchx",
                                                        "dag_run_id": "gone-1", "api": {"timeout": 2.0}})  # fmt: skip
    assert runner.list("airflow") == []  # no traceback: the deployment is down, nothing else to list
    with pytest.raises(RuntimeError, match="cannot reach the Airflow API"):
        runner.status("airflow://torchx/torchstep_torchx:gone-1")
