"""``torchx run -s airflow``: an AppDef submitted to an Airflow 3 deployment as a run of the
generic DAG (:mod:`torchstep_airflow.torchx_dag`), through Airflow's REST API.

* ``submit``: ``POST /api/v2/dags/<dag_id>/dagRuns`` with the conf ``{"app": <AppDef as
  JSON>, "target": ..., "cfg": ...}``; the dry run prints exactly that request, after every
  check the task will make of it (the AppDef and ``step_cfg`` for the target). The app id is
  ``<dag_id>:<dag_run_id>``; the ``dag_run_id`` is chosen here, so a submission whose answer
  was lost is retried without a second run.
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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppDef, AppDryRunInfo, AppState

from torchstep.errors import SpecError
from torchstep.plan.names import is_airflow_id
from torchstep.schedulers import base, generic, records, rest

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


# -- options ----------------------------------------------------------------------------
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "endpoint": (str, None, f"Airflow API server URL, e.g. http://127.0.0.1:8080 (default: ${ENDPOINT_ENV})"),
    "dag_id": (str, DAG_ID, "the generic DAG (python -m torchstep_airflow.torchx_dag DAGS_FOLDER)"),
    "queue": (str, None, "executor queue: runs DAG <dag_id>_<queue>, deployed with torchx_dag(queue=...)"),
    "target": (str, "local", "where the task runs the app: local (in the Airflow worker) or kubernetes"),
    "namespace": (str, None, "Kubernetes namespace (target kubernetes)"),
    "step_cfg": (dict, None, "options of the target (torchstep runopts local|kubernetes), k:v;k2:v2"),
    "token_env": (
        str,
        "AIRFLOW_API_TOKEN",
        "NAME of the environment variable holding a bearer token (never the token itself)",
    ),
    "username": (str, None, "user for POST /auth/token (password from password_env)"),
    "password_env": (str, "AIRFLOW_PASSWORD", "NAME of the environment variable holding the password of username"),
    "timeout": (float, 30.0, "seconds per API request"),
}


@dataclass(frozen=True)
class AirflowOptions:
    """The checked ``cfg`` of one submission (see :data:`OPTIONS`)."""

    endpoint: str
    dag_id: str = DAG_ID
    queue: str | None = None
    target: str = "local"
    namespace: str | None = None
    step_cfg: Mapping[str, str] = field(default_factory=dict)
    token_env: str = "AIRFLOW_API_TOKEN"
    username: str | None = None
    password_env: str = "AIRFLOW_PASSWORD"
    timeout: float = 30.0

    @property
    def api(self) -> dict[str, Any]:
        """How to call the API: what the record keeps (variable names, never their values)."""
        return {
            "token_env": self.token_env,
            "username": self.username,
            "password_env": self.password_env,
            "timeout": self.timeout,
        }


def resolve(cfg: Mapping[str, Any]) -> AirflowOptions:
    """``cfg`` (typed, or strings as ``-cfg`` gives them) checked: a SpecError naming
    ``cfg['<key>']`` and the fix otherwise; a credential is never echoed."""
    opts = base.parse(cfg, OPTIONS, scheduler=BACKEND, target=None)
    opts["endpoint"] = base.endpoint(
        opts["endpoint"] or os.environ.get(ENDPOINT_ENV),
        api="Airflow API",
        target=None,
        fix=f"-cfg endpoint=http://HOST:PORT (or export {ENDPOINT_ENV}); credentials go in token_env / password_env",
    )
    base.check_step_target(opts["target"], opts["namespace"])
    for key, dag_id in (("dag_id", opts["dag_id"]), ("queue", dag_id_for(opts["queue"], opts["dag_id"]))):
        if not is_airflow_id(dag_id):
            raise SpecError(
                f"cfg[{key!r}]",
                None,
                f"{opts[key]!r} does not make a valid DAG id",
                fix="letters, digits, '_', '.' and '-' only (as the DAG deployed with torchx_dag)",
            )
    for key in ("token_env", "password_env"):
        base.check_secret_var(opts, key, default=OPTIONS[key][1], target=None)
    if opts["username"] is not None:
        if not opts["username"].isprintable():
            raise SpecError("cfg['username']", None, "must be a printable user name", fix="-cfg username=USER")
        if base.secret(opts["token_env"]) is None and base.secret(opts["password_env"]) is None:
            raise SpecError(
                "cfg['username']",
                None,
                f"needs its password in ${opts['password_env']}, which is not set",
                fix=f"export {opts['password_env']}=<the password> (or name another with password_env)",
            )
    base.check_seconds(opts["timeout"], "timeout", target=None)
    opts["step_cfg"] = dict(opts["step_cfg"] or {})
    if opts["namespace"] not in (None, opts["step_cfg"].get("namespace", opts["namespace"])):
        raise SpecError(
            "cfg['namespace']",
            None,
            f"{opts['namespace']!r} conflicts with step_cfg's namespace {opts['step_cfg']['namespace']!r}",
            fix="give the namespace once",
        )
    return AirflowOptions(**opts)


def dag_id_for(queue: str | None = None, dag_id: str = DAG_ID) -> str:
    """The DAG id serving ``queue`` (``torchstep_torchx_<queue>``; the plain id without one)."""
    return f"{dag_id}_{queue}" if queue else dag_id


# -- the request and the API ------------------------------------------------------------
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


class AirflowAPI(rest.RestClient):
    """The Airflow REST API (``/api/v2``) with the credentials the named variables hold:
    a bearer token, else a token for ``username`` from ``POST /auth/token``, else one from
    ``GET /auth/token`` (simple auth manager, ``all_admins``)."""

    backend = BACKEND
    api = "Airflow API"

    def __init__(
        self,
        endpoint: str,
        token_env: str = "AIRFLOW_API_TOKEN",
        username: str | None = None,
        password_env: str = "AIRFLOW_PASSWORD",
        timeout: float = 30.0,
    ) -> None:
        super().__init__(endpoint, timeout=timeout)
        self.token_env, self.username, self.password_env = token_env, username, password_env

    def unreachable_fix(self) -> str:
        return f"start `airflow api-server`, or set -cfg endpoint=... (or ${ENDPOINT_ENV})"

    def auth_fix(self) -> str:
        return (
            f"export a token in ${self.token_env}, or set -cfg username=... with the password in ${self.password_env}"
        )

    def auth_headers(self) -> dict[str, str]:
        if not self.headers:
            token = base.secret(self.token_env)
            if token is None and self.username:
                password = base.secret(self.password_env)
                if password is None:
                    raise base.SchedulerError(
                        f"airflow: -cfg username={self.username} needs its password in "
                        f"${self.password_env}, which is not set in this process"
                    )
                body = {"username": self.username, "password": password}
                token = self.call("POST", "/auth/token", body, auth=False, idempotent=True)["access_token"]
            elif token is None:  # simple auth manager with all_admins (development)
                token = self.call("GET", "/auth/token", auth=False)["access_token"]
            self.headers["Authorization"] = f"Bearer {token}"
        return self.headers


# -- the scheduler ----------------------------------------------------------------------
class AirflowScheduler(base.TorchstepScheduler, backend=BACKEND, options=OPTIONS):
    """The ``airflow`` TorchX scheduler (see the module docstring)."""

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        opts = resolve(cfg)
        run_id = base.new_app_id(app.name)
        step_cfg = {**opts.step_cfg, **({"namespace": opts.namespace} if opts.namespace else {})}
        from torchstep.plan.planner import build_plan

        plan = build_plan(app, opts.target)  # once: for the conf and for the step's options
        conf = generic.step_conf(app, opts.target, step_cfg, plan=plan)
        generic.check_step_cfg(app, opts.target, step_cfg, run_id, field="cfg['step_cfg']", plan=plan)
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf, "note": "torchx run"}
        return AppDryRunInfo(AirflowRequest(opts.endpoint, dag_id_for(opts.queue, opts.dag_id), body, opts.api), str)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        req: AirflowRequest = dryrun_info.request
        api = AirflowAPI(req.endpoint, **req.api)
        dag = api.call("GET", f"/api/v2/dags/{rest.segment(req.dag_id)}", ok404=True)
        if dag is None:
            raise base.SchedulerError(
                f"airflow: the DAG {req.dag_id} is not deployed at {req.endpoint}; fix: "
                "python -m torchstep_airflow.torchx_dag DAGS_FOLDER (or torchx_dag(queue=...) for a queue)"
            )
        if dag.get("is_paused"):
            raise base.SchedulerError(
                f"airflow: the DAG {req.dag_id} is paused; fix: airflow dags unpause {req.dag_id}"
            )
        runs = f"/api/v2/dags/{rest.segment(req.dag_id)}/dagRuns"
        run_id = req.body["dag_run_id"]

        def ours() -> Any:  # an earlier try made it (its answer was lost): the same run, not a second one
            run = api.call("GET", f"{runs}/{rest.segment(run_id)}")
            if run.get("conf") != req.body["conf"]:
                raise base.SchedulerError(
                    f"airflow: a DAG run {run_id} exists already and is not this submission; "
                    "fix: submit again (a new run id)"
                )
            return run

        run = api.call("POST", runs, req.body, idempotent=True, on_conflict=ours)
        app_id = f"{req.dag_id}:{run['dag_run_id']}"
        record = {"endpoint": req.endpoint, "dag_id": req.dag_id, "dag_run_id": run["dag_run_id"], "api": req.api}
        records.save(BACKEND, app_id, record)
        return app_id

    # -- reading state ---------------------------------------------------------------------
    def _locate(self, app_id: str) -> tuple[AirflowAPI, str] | None:
        """The API and the DAG run path of ``app_id`` (from the record; else the endpoint
        of the environment and the id itself, ``<dag_id>:<dag_run_id>``)."""
        rec = self._record(app_id)
        if rec is not None:
            api = AirflowAPI(rec["endpoint"], **rec.get("api", {}))
            dag_id, run_id = rec["dag_id"], rec["dag_run_id"]
        else:
            dag_id, sep, run_id = app_id.partition(":")
            endpoint = os.environ.get(ENDPOINT_ENV)
            if not sep or not endpoint:
                return None
            api = AirflowAPI(endpoint)
        return api, f"/api/v2/dags/{rest.segment(dag_id)}/dagRuns/{rest.segment(run_id)}"

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        found = self._locate(app_id)
        if found is None:
            return None
        api, path = found
        run = api.call("GET", path, ok404=True)
        if run is None:
            return None
        state = _STATES.get(run.get("state"), AppState.UNKNOWN)
        if state == AppState.FAILED and (run.get("note") or "").startswith(CANCEL_NOTE):
            state = AppState.CANCELLED
        ti: dict[str, Any] = {}
        try:
            ti = api.call("GET", f"{path}/taskInstances/{TASK_ID}")
        except base.SchedulerError:
            pass
        if state == AppState.RUNNING and ti.get("state") in (None, "scheduled", "queued"):
            state = AppState.PENDING  # the run started, the task waits for a worker slot
        msg = ti.get("state") or ""
        if state in (AppState.FAILED, AppState.SUCCEEDED):
            msg = self._result_message(api, path) or msg
        ui = f"{api.endpoint}/dags/{rest.segment(run.get('dag_id', ''))}/runs/{rest.segment(run.get('dag_run_id', ''))}"
        resp = base.response(app_id, state, msg, ui_url=ui)
        resp.num_restarts = max(0, int(ti.get("try_number") or 1) - 1)
        resp.roles = base.roles_of((run.get("conf") or {}).get("app"))
        resp.roles_statuses = base.run_role_statuses(resp.roles, state, "airflow")
        return resp

    @staticmethod
    def _result_message(api: AirflowAPI, path: str) -> str:
        """The step result's summary (XCom ``return_value``), when the task pushed one."""
        try:
            xcom = api.call("GET", f"{path}/taskInstances/{TASK_ID}/xcomEntries/return_value?deserialize=true")
        except base.SchedulerError:
            return ""
        return generic.result_message((xcom or {}).get("value"))

    def _cancel_existing(self, app_id: str) -> None:
        found = self._locate(app_id)
        if found is None:
            return
        api, path = found
        run = api.call("GET", path)
        if run.get("state") in ("success", "failed"):
            return
        api.call("PATCH", path, {"state": "failed", "note": CANCEL_NOTE}, idempotent=True)

    def _log_lines(
        self, app_id: str, role_name: str, k: int, *, since: datetime | None, until: datetime | None, tail: bool
    ) -> Iterable[str]:
        """The Airflow task log of the latest try, the lines of ``role_name``: one task runs
        every replica, so replica 0's log holds every replica's lines (each prefixed
        ``[role/rank]``) and Airflow's own lines go with the first role; a replica ``k > 0``
        gets one line saying so (``torchx log`` asks for every replica in turn)."""
        found = self._locate(app_id)
        desc = self.describe(app_id) if found else None
        if found is None or desc is None:
            raise ValueError(f"{BACKEND}: unknown app {app_id!r}; fix: use the handle `torchx run` printed")
        if k > 0:
            return [
                f"(one Airflow task runs every replica: the lines of {role_name} replica {k} are in replica 0's log)\n"
            ]
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

        return base.follow(fetch, lambda: self.finished(app_id), tail=tail, until=until)


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
