"""``torchx run -s airflow``: an AppDef submitted to an Airflow 3 deployment as a run of the
generic DAG (:mod:`torchstep_airflow.torchx_dag`), through Airflow's REST API.

* ``submit``: ``POST /api/v2/dags/<dag_id>/dagRuns`` with the conf ``{"app": <AppDef as
  JSON>, "target": ..., "cfg": ...}``; the dry run prints exactly that request. The app
  id is ``<dag_id>:<dag_run_id>``.
* ``status``: the DAG run's state (``queued`` → PENDING, ``running`` → RUNNING,
  ``success`` → SUCCEEDED, ``failed`` → FAILED, or CANCELLED when ``torchx cancel`` failed
  it), the task's try number as restarts, and the step result's root cause as message.
* ``log``: the task log of the latest try (every replica's lines, each prefixed
  ``[role/rank]``); ``-t`` follows it until the run ends.
* ``cancel``: marks the DAG run failed (with a note): Airflow stops the task, whose
  ``on_kill`` stops every process of the step.

Credentials are never stored: ``token_env`` / ``password_env`` name the environment
variables that hold them. Without either, the scheduler asks ``GET /auth/token`` (Airflow's
simple auth manager with ``all_admins``, a development setup).

Example::

    torchx run -s airflow -cfg endpoint=http://127.0.0.1:8080 utils.echo --msg hi
    torchx status airflow://torchx/torchstep_torchx:echo-1a2b3c
    torchx log airflow://torchx/torchstep_torchx:echo-1a2b3c/echo
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchstep.errors import SpecError
from torchstep.schedulers import base, records
from torchx.schedulers.api import DescribeAppResponse, Stream
from torchx.specs import AppDef, AppDryRunInfo, AppState, ReplicaStatus, RoleStatus, runopts

BACKEND = "airflow"
#: Environment variable read when ``-cfg endpoint`` is not given.
ENDPOINT_ENV = "TORCHSTEP_AIRFLOW_ENDPOINT"
CANCEL_NOTE = "cancelled by torchx"
#: The generic DAG's default id and its one task (:mod:`torchstep_airflow.torchx_dag`).
DAG_ID = "torchstep_torchx"
TASK_ID = "app"
_STATES = {
    "queued": AppState.PENDING,
    "running": AppState.RUNNING,
    "success": AppState.SUCCEEDED,
    "failed": AppState.FAILED,
}
_TASK_RUNNING = {"up_for_retry", "up_for_reschedule", "deferred", "restarting"}

# name -> (type, default, help)
_OPTS: dict[str, tuple[Any, Any, str]] = {
    "endpoint": (str, None, f"Airflow API server URL, e.g. http://127.0.0.1:8080 (default: ${ENDPOINT_ENV})"),
    "dag_id": (str, DAG_ID, "the generic DAG (python -m torchstep_airflow.torchx_dag DAGS_FOLDER)"),
    "queue": (str, None, "executor queue: runs DAG <dag_id>_<queue>, deployed with torchx_dag(queue=...)"),
    "target": (str, "local", "where the task runs the app: local (in the Airflow worker) or kubernetes"),
    "namespace": (str, None, "Kubernetes namespace (target kubernetes)"),
    "step_cfg": (dict, None, "options of the target (torchstep runopts local|kubernetes), k:v;k2:v2"),
    "token_env": (str, "AIRFLOW_API_TOKEN", "environment variable holding a bearer token (the token is never stored)"),
    "username": (str, None, "user for POST /auth/token (password from password_env)"),
    "password_env": (str, "AIRFLOW_PASSWORD", "environment variable holding the password of username"),
    "timeout": (float, 30.0, "seconds per API request"),
}


class AirflowApiError(RuntimeError):
    """An Airflow API call failed; the message says which call and what to do."""


@dataclass
class Api:
    """The few Airflow REST calls the scheduler makes (urllib: no extra dependency)."""

    endpoint: str
    token_env: str = "AIRFLOW_API_TOKEN"
    username: str | None = None
    password_env: str = "AIRFLOW_PASSWORD"
    timeout: float = 30.0
    _token: str | None = field(default=None, repr=False)

    def call(self, method: str, path: str, body: Any = None, *, auth: bool = True) -> Any:
        req = urllib.request.Request(self.endpoint.rstrip("/") + path, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json")
        if auth:
            req.add_header("Authorization", f"Bearer {self.token()}")
        data = json.dumps(body).encode() if body is not None else None
        try:
            with urllib.request.urlopen(req, data=data, timeout=self.timeout) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as e:
            detail = e.read().decode(errors="replace")[:500]
            if e.code in (401, 403):
                raise AirflowApiError(
                    f"airflow: {method} {path}: not authorized ({e.code}); fix: export a token in "
                    f"${self.token_env}, or set -cfg username=... with the password in ${self.password_env}"
                ) from None
            raise AirflowApiError(f"airflow: {method} {path}: HTTP {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise AirflowApiError(
                f"airflow: cannot reach the Airflow API at {self.endpoint} ({reason}); "
                f"fix: start `airflow api-server`, or set -cfg endpoint=... (or ${ENDPOINT_ENV})"
            ) from None
        return json.loads(text) if text else {}

    def token(self) -> str:
        if self._token is None:
            if os.environ.get(self.token_env):
                self._token = os.environ[self.token_env]
            elif self.username:
                password = os.environ.get(self.password_env)
                if not password:
                    raise AirflowApiError(
                        f"airflow: -cfg username={self.username} needs its password in ${self.password_env}"
                    )
                got = self.call("POST", "/auth/token", {"username": self.username, "password": password}, auth=False)
                self._token = got["access_token"]
            else:  # simple auth manager with all_admins (development)
                self._token = self.call("GET", "/auth/token", auth=False)["access_token"]
        return self._token


@dataclass
class AirflowRequest:
    """The native request: the DAG run to create (what the dry run prints)."""

    endpoint: str
    dag_id: str
    body: dict[str, Any]
    api: dict[str, Any]

    def __str__(self) -> str:
        path = f"POST {self.endpoint.rstrip('/')}/api/v2/dags/{self.dag_id}/dagRuns"
        return f"{path}\n{json.dumps(self.body, indent=2, sort_keys=True)}"


def dag_id_for(queue: str | None = None, dag_id: str = DAG_ID) -> str:
    """The DAG id serving ``queue`` (``torchstep_torchx_<queue>``; the plain id without one)."""
    return f"{dag_id}_{queue}" if queue else dag_id


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


class AirflowScheduler(base.TorchstepScheduler):
    """The ``airflow`` TorchX scheduler (see the module docstring)."""

    unreachable = (AirflowApiError,)

    def __init__(self, session_name: str, **_: Any) -> None:
        super().__init__(BACKEND, session_name)

    def _run_opts(self) -> runopts:
        from torchstep.plan.options import to_runopts

        return to_runopts(_OPTS)

    def _options(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        from torchstep.plan.options import parse_options

        opts = {k: v for k, v in _OPTS.items() if v[1] is not None}
        out = {k: v[1] for k, v in opts.items()}
        out.update(parse_options({k: v for k, v in cfg.items() if v is not None}, _OPTS, target=BACKEND))
        out["endpoint"] = out.get("endpoint") or os.environ.get(ENDPOINT_ENV)
        fix = f"-cfg endpoint=http://HOST:PORT (or export {ENDPOINT_ENV}); credentials go in token_env / password_env"
        if not out["endpoint"]:
            raise SpecError("cfg['endpoint']", BACKEND, "no Airflow API server given", fix=fix)
        out["endpoint"] = base.check_endpoint(out["endpoint"], "cfg['endpoint']", BACKEND, fix=fix)
        if out["target"] not in ("local", "kubernetes"):
            raise SpecError("cfg['target']", BACKEND, f"unknown target {out['target']!r}", fix="local or kubernetes")
        return out

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        opts = self._options(cfg)
        step_cfg = dict(opts.get("step_cfg") or {})
        if opts.get("namespace"):
            if opts["target"] != "kubernetes":
                raise SpecError("cfg['namespace']", BACKEND, "only the kubernetes target has one", fix="drop it")
            step_cfg["namespace"] = opts["namespace"]
        conf = {"app": base.app_payload(app, opts["target"]), "target": opts["target"], "cfg": step_cfg}
        body = {"dag_run_id": base.new_app_id(app.name), "logical_date": None, "conf": conf, "note": "torchx run"}
        api = {k: opts.get(k) for k in ("token_env", "username", "password_env", "timeout")}
        request = AirflowRequest(opts["endpoint"], dag_id_for(opts.get("queue"), opts["dag_id"]), body, api)
        return AppDryRunInfo(request, str)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        req: AirflowRequest = dryrun_info.request
        api = Api(req.endpoint, **req.api)
        try:
            dag = api.call("GET", f"/api/v2/dags/{_quote(req.dag_id)}")
        except AirflowApiError as e:
            if "HTTP 404" in str(e):
                raise AirflowApiError(
                    f"airflow: the DAG {req.dag_id} is not deployed at {req.endpoint}; fix: "
                    "python -m torchstep_airflow.torchx_dag DAGS_FOLDER (or torchx_dag(queue=...) for a queue)"
                ) from None
            raise
        if dag.get("is_paused"):
            raise AirflowApiError(f"airflow: the DAG {req.dag_id} is paused; fix: airflow dags unpause {req.dag_id}")
        run = api.call("POST", f"/api/v2/dags/{_quote(req.dag_id)}/dagRuns", req.body)
        app_id = f"{req.dag_id}:{run['dag_run_id']}"
        records.save(
            BACKEND,
            app_id,
            {"endpoint": req.endpoint, "dag_id": req.dag_id, "dag_run_id": run["dag_run_id"], "api": req.api},
        )
        return app_id

    # -- reading state ---------------------------------------------------------------------
    def _locate(self, app_id: str) -> tuple[Api, str] | None:
        """The API and the DAG run path of ``app_id`` (from the record; else the endpoint
        of the environment and the id itself, ``<dag_id>:<dag_run_id>``)."""
        try:
            rec = records.load(BACKEND, app_id)
        except ValueError:  # not an id we hand out (a run triggered elsewhere): no record
            rec = None
        if rec is not None:
            api = Api(rec["endpoint"], **rec.get("api", {}))
            dag_id, run_id = rec["dag_id"], rec["dag_run_id"]
        else:
            dag_id, sep, run_id = app_id.partition(":")
            endpoint = os.environ.get(ENDPOINT_ENV)
            if not sep or not endpoint:
                return None
            api = Api(endpoint)
        return api, f"/api/v2/dags/{_quote(dag_id)}/dagRuns/{_quote(run_id)}"

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        found = self._locate(app_id)
        if found is None:
            return None
        api, path = found
        try:
            run = api.call("GET", path)
        except AirflowApiError as e:
            if "HTTP 404" in str(e):
                return None
            raise
        state = _STATES.get(run.get("state"), AppState.UNKNOWN)
        if state == AppState.FAILED and (run.get("note") or "").startswith(CANCEL_NOTE):
            state = AppState.CANCELLED
        ti: dict[str, Any] = {}
        try:
            ti = api.call("GET", f"{path}/taskInstances/{TASK_ID}")
        except AirflowApiError:
            pass
        if state == AppState.RUNNING and ti.get("state") in (None, "scheduled", "queued"):
            state = AppState.PENDING  # the run started, the task waits for a worker slot
        msg = ti.get("state") or ""
        if state in (AppState.FAILED, AppState.SUCCEEDED):
            msg = self._result_message(api, path) or msg
        ui = f"{api.endpoint.rstrip('/')}/dags/{_quote(run.get('dag_id', ''))}/runs/{_quote(run.get('dag_run_id', ''))}"
        resp = base.response(app_id, state, msg, ui_url=ui)
        resp.num_restarts = max(0, int(ti.get("try_number") or 1) - 1)
        conf = run.get("conf") or {}
        resp.roles = base.roles_of(conf.get("app"))
        resp.roles_statuses = [
            RoleStatus(role.name, [ReplicaStatus(i, state, role.name, "airflow") for i in range(role.num_replicas)])
            for role in resp.roles
        ]
        return resp

    @staticmethod
    def _result_message(api: Api, path: str) -> str:
        """The step result's summary (XCom ``return_value``), when the task pushed one."""
        try:
            xcom = api.call("GET", f"{path}/taskInstances/{TASK_ID}/xcomEntries/return_value?deserialize=true")
        except AirflowApiError:
            return ""
        value = xcom.get("value")
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                return ""
        if not isinstance(value, dict):
            return ""
        from torchstep.result import StepResult
        from torchstep.steps import failure_summary

        try:
            result = StepResult.from_dict(value)
        except (KeyError, TypeError, ValueError):
            return ""
        return "" if result.succeeded else failure_summary(result)

    def _cancel_existing(self, app_id: str) -> None:
        found = self._locate(app_id)
        if found is None:
            return
        api, path = found
        run = api.call("GET", path)
        if run.get("state") in ("success", "failed"):
            return
        api.call("PATCH", path, {"state": "failed", "note": CANCEL_NOTE})

    def log_iter(
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        """The Airflow task log of the latest try, the lines of ``role_name``: one task runs
        every replica, so replica 0's log holds every replica's lines (each prefixed
        ``[role/rank]``) and Airflow's own lines go with the first role; a replica ``k > 0``
        gets one line saying so (``torchx log`` asks for every replica in turn)."""
        base.check_stream(streams, BACKEND)
        found = self._locate(app_id)
        desc = self.describe(app_id) if found else None
        if found is None or desc is None:
            raise ValueError(f"{BACKEND}: unknown app {app_id!r}; fix: use the handle `torchx run` printed")
        if k > 0:
            return [f"(one Airflow task runs every replica: {role_name}/{k}'s lines are in {role_name}/0's log)\n"]
        api, path = found
        names = [r.name for r in desc.roles] or [role_name]
        seen = {"try": 0}

        def fetch(cursor: int, final: bool) -> tuple[list[str], int]:
            ti = api.call("GET", f"{path}/taskInstances/{TASK_ID}")
            try_number = int(ti.get("try_number") or 0)
            if try_number < 1:
                return [], cursor
            if try_number != seen["try"]:
                seen["try"], cursor = try_number, 0
            log = api.call("GET", f"{path}/taskInstances/{TASK_ID}/logs/{try_number}?full_content=true")
            lines = [_log_line(e) for e in log.get("content") or []]
            return list(base.lines_of_role(lines[cursor:], role_name, names)), len(lines)

        return base.select_lines(
            base.follow(fetch, lambda: self.finished(app_id), tail=should_tail, until=until), regex
        )


def _log_line(entry: Any) -> str:
    """One entry of Airflow's structured task log as text (an exception's type and message
    included: "Task failed with exception" alone would hide the root cause)."""
    if not isinstance(entry, dict):
        return str(entry)
    text = str(entry.get("event", ""))
    for err in entry.get("error_detail") or []:
        if isinstance(err, dict):
            text += f"\n{err.get('exc_type', 'Error')}: {err.get('exc_value', '')}"
    return text


def create_scheduler(session_name: str, **kwargs: Any) -> AirflowScheduler:
    """The ``torchx.schedulers`` entry point of ``airflow``."""
    return AirflowScheduler(session_name, **kwargs)
