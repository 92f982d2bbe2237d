"""``torchx run -s prefect``: an AppDef as a flow run of the generic ``torchstep-torchx`` flow.

``schedule`` checks the AppDef for the target that will run it, then creates a flow run of a
deployment of :func:`torchstep_prefect.torchx_flow.torchx_app` through the Prefect REST API
(``POST /deployments/{id}/create_flow_run``) with the AppDef as JSON data in its parameters;
the flow run runs it through :func:`~torchstep_prefect.app_task` (retries, timeouts,
cancellation, each rank's lines in the run's log). The flow run is named after the app id
(``<app>-<6 chars>``) and a private record (:mod:`torchstep.schedulers.records`) keeps the
endpoint, the flow run id and the *names* of the credential variables, so ``torchx status``,
``log``, ``cancel`` and ``list`` work from any process; without a record (another machine)
they look the run up by name on ``PREFECT_API_URL``. ``cancel`` sets the run Cancelling
like ``prefect flow-run cancel``: the runner stops the flow and every process of the step.

Example (a server, the generic flow served, then TorchX)::

    prefect server start &
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m torchstep_prefect.torchx_flow serve --name torchx &
    torchx run -s prefect utils.echo --msg hi         # prefect://torchx/echo-1a2b3c
    torchx status prefect://torchx/echo-1a2b3c
    torchx log prefect://torchx/echo-1a2b3c
    torchx run -s prefect -cfg target=kubernetes,namespace=ml,queue=gpu dist.ddp -j 2x2 --script train.py
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

from torchstep.errors import SpecError
from torchstep.schedulers import base, records
from torchx.schedulers.api import DescribeAppResponse, ListAppResponse, Stream
from torchx.specs import AppDef, AppDryRunInfo, AppState, ReplicaStatus, Role, RoleStatus, macros, runopts

from torchstep_prefect.torchx_api import (
    ENDPOINT_FIX,
    PrefectAPI,
    PrefectAPIError,
    check_endpoint,
    default_endpoint,
    ui_url,
)

BACKEND = "prefect"
FLOW_NAME = "torchstep-torchx"  # torchx_flow.FLOW_NAME (that module imports prefect)
DEFAULT_DEPLOYMENT = f"{FLOW_NAME}/torchx"
TARGETS = ("local", "kubernetes")
#: Prefect state type -> TorchX AppState (a run being cancelled is already CANCELLED to TorchX).
STATES = {
    "SCHEDULED": AppState.SUBMITTED, "PENDING": AppState.PENDING, "PAUSED": AppState.PENDING,
    "RUNNING": AppState.RUNNING, "COMPLETED": AppState.SUCCEEDED, "FAILED": AppState.FAILED,
    "CRASHED": AppState.FAILED, "CANCELLING": AppState.CANCELLED, "CANCELLED": AppState.CANCELLED,
}  # fmt: skip
_FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")  # Prefect's final states: no more logs
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")  # upper case: a pasted key (pnu_...) is refused
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: Seconds after a flow run's end until its log is taken as complete (Prefect ships logs in
#: batches every 2 s; the flow engine's "Finished in state" line ends it sooner).
LOG_GRACE_S = 10.0
_SERVE_FIX = (
    "serve it (`python -m torchstep_prefect.torchx_flow serve --name torchx` with PREFECT_API_URL set) "
    "or deploy the flow to a work pool, or name your deployment with -cfg deployment=FLOW/NAME"
)

# name -> (type, default, help); `torchx runopts prefect` prints them.
OPTIONS: dict[str, tuple[type, Any, str]] = {
    "endpoint": (str, None, "Prefect API URL, e.g. http://127.0.0.1:4200/api (default: PREFECT_API_URL of the "
                 "environment, else of the active Prefect profile)"),
    "api_key_env": (str, "PREFECT_API_KEY", "NAME of the environment variable holding a Prefect Cloud API key "
                    "(sent as a Bearer token when set; never the key itself)"),
    "auth_string_env": (str, "PREFECT_API_AUTH_STRING", "NAME of the environment variable holding a self-hosted "
                        "server's 'user:password' (Basic auth when set; never the value itself)"),
    "deployment": (str, DEFAULT_DEPLOYMENT, "deployment of the torchstep-torchx flow, FLOW/NAME "
                   "(`python -m torchstep_prefect.torchx_flow serve --name NAME`)"),
    "queue": (str, None, "work queue of the flow run (a work-pool deployment only; default: the deployment's)"),
    "tags": (list, None, "tags of the flow run, ';'-separated"),
    "target": (str, "local", "where the step runs: local (on the machine of the flow run) or kubernetes (Jobs)"),
    "namespace": (str, None, "Kubernetes namespace of the step's Jobs (target=kubernetes only; default: default)"),
}  # fmt: skip


@dataclass(frozen=True)
class Options:
    """The checked ``cfg`` of one submission."""

    endpoint: str | None
    api_key_env: str
    auth_string_env: str
    deployment: str
    queue: str | None
    tags: list[str]
    target: str
    namespace: str | None


def resolve(cfg: Mapping[str, Any]) -> Options:
    """``cfg`` (typed, or strings as ``-cfg`` gives them) checked: a SpecError naming
    ``cfg['<key>']`` and the fix otherwise; a credential *value* is never echoed."""
    given = {k: v for k, v in cfg.items() if v is not None}
    for key, value in given.items():
        if key not in OPTIONS:
            raise SpecError(f"cfg[{key!r}]", None, "unknown option of the prefect scheduler",
                            fix=f"use one of: {', '.join(OPTIONS)} (`torchx runopts prefect`)")  # fmt: skip
        if OPTIONS[key][0] is str and (not isinstance(value, str) or not value or "\x00" in value):
            raise SpecError(f"cfg[{key!r}]", None, "must be a non-empty string", fix="see `torchx runopts prefect`")
    opts = {k: given.get(k, default) for k, (_, default, _) in OPTIONS.items()}
    for key in ("api_key_env", "auth_string_env"):
        if not _ENV_NAME.fullmatch(opts[key]):  # maybe a secret pasted in: never repeat it
            raise SpecError(f"cfg[{key!r}]", None, "must be the NAME of an environment variable, in upper case (the "
                            "value given is not shown)", fix=f"export the secret and pass its name: -cfg {key}=MY_VAR")  # fmt: skip
    if opts["target"] not in TARGETS:
        raise SpecError("cfg['target']", None, f"unknown target {opts['target']!r}", fix="-cfg target=local|kubernetes")
    if opts["namespace"] is not None:
        if opts["target"] != "kubernetes":
            raise SpecError("cfg['namespace']", None, "only applies to target=kubernetes",
                            fix="add -cfg target=kubernetes, or drop namespace")  # fmt: skip
        if not _DNS_LABEL.fullmatch(opts["namespace"]):
            raise SpecError("cfg['namespace']", None, f"{opts['namespace']!r} is not a Kubernetes namespace name",
                            fix="lower-case letters, digits and '-', at most 63")  # fmt: skip
    flow, sep, name = opts["deployment"].partition("/")
    if not sep or not flow or not name or "/" in name:
        raise SpecError("cfg['deployment']", None, f"{opts['deployment']!r} is not FLOW/NAME",
                        fix=f"e.g. -cfg deployment={DEFAULT_DEPLOYMENT}")  # fmt: skip
    tags = opts["tags"] or []
    if isinstance(tags, str):
        tags = [t.strip() for t in tags.replace(",", ";").split(";") if t.strip()]
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags):
        raise SpecError("cfg['tags']", None, "must be a list of strings", fix="-cfg tags=a;b")
    endpoint = opts["endpoint"]
    if endpoint is not None:
        endpoint = check_endpoint(endpoint, "cfg['endpoint']")
    return Options(endpoint, opts["api_key_env"], opts["auth_string_env"], opts["deployment"], opts["queue"],
                   list(tags), opts["target"], opts["namespace"])  # fmt: skip


@dataclass
class PrefectRequest:
    """What ``schedule`` sends: a flow run of ``deployment`` with these parameters."""

    app_id: str
    endpoint: str | None
    deployment: str
    parameters: dict[str, Any]
    queue: str | None
    tags: list[str]
    api_key_env: str
    auth_string_env: str

    def body(self) -> dict[str, Any]:
        """The body of ``POST /deployments/{id}/create_flow_run``."""
        out = {"name": self.app_id, "idempotency_key": self.app_id, "parameters": self.parameters, "tags": self.tags}
        return out | ({"work_queue_name": self.queue} if self.queue else {})

    def __str__(self) -> str:
        flow, _, name = self.deployment.partition("/")
        return (
            f"prefect: POST {self.endpoint or '<' + ENDPOINT_FIX + '>'}/deployments/{{id of {self.deployment}}}"
            f"/create_flow_run\n  (id from GET /deployments/name/{flow}/{name}; credentials: ${self.auth_string_env}"
            f" or ${self.api_key_env} when set)\n{json.dumps(self.body(), indent=1, sort_keys=True)}"
        )


def roles_of(parameters: Any) -> list[Role]:
    """The roles (name, replicas) of the AppDef in a flow run's parameters."""
    app = parameters.get("app") if isinstance(parameters, dict) else None
    roles = app.get("roles") if isinstance(app, dict) else None
    out = []
    for r in roles if isinstance(roles, list) else []:
        if isinstance(r, dict) and isinstance(r.get("name"), str):
            n = r.get("num_replicas", 1)
            out.append(Role(r["name"], image=str(r.get("image", "")), num_replicas=n if isinstance(n, int) else 1))
    return out


class PrefectScheduler(base.TorchstepScheduler):
    """The ``prefect`` TorchX scheduler (see the module docstring)."""

    def __init__(self, session_name: str, **_: Any) -> None:
        super().__init__(BACKEND, session_name)
        httpx_logger = logging.getLogger("httpx")
        if httpx_logger.level == logging.NOTSET:  # not a line per API call in `torchx` output
            httpx_logger.setLevel(logging.WARNING)

    def _run_opts(self) -> runopts:
        from torchstep.plan.options import to_runopts

        return to_runopts(OPTIONS)  # type: ignore[no-any-return]

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        opts = resolve(cfg)
        payload = base.app_payload(app, opts.target)  # SpecError naming the field
        app_id = base.new_app_id(app.name)
        for role in payload["roles"]:  # the handle TorchX tells the app is this one, not a try's id
            job_id = (role.get("env") or {}).get("TORCHX_JOB_ID")
            if isinstance(job_id, str):
                role["env"]["TORCHX_JOB_ID"] = job_id.replace(macros.app_id, app_id)
        request = PrefectRequest(
            app_id=app_id,
            endpoint=opts.endpoint or default_endpoint(),
            deployment=opts.deployment,
            parameters={"app": payload, "target": opts.target, "cfg": {"namespace": opts.namespace} if opts.namespace else {}},
            queue=opts.queue,
            tags=opts.tags,
            api_key_env=opts.api_key_env,
            auth_string_env=opts.auth_string_env,
        )  # fmt: skip
        return AppDryRunInfo(request, str)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        req: PrefectRequest = dryrun_info.request
        if not req.endpoint:
            raise PrefectAPIError(f"prefect: no Prefect API to submit to; fix: {ENDPOINT_FIX}")
        for key, name in (("api_key_env", req.api_key_env), ("auth_string_env", req.auth_string_env)):
            if name != OPTIONS[key][1] and not os.environ.get(name):
                raise PrefectAPIError(f"prefect: cfg['{key}'] names ${name}, which is not set; fix: export {name}")
        api = PrefectAPI(req.endpoint, req.api_key_env, req.auth_string_env)
        flow, _, name = req.deployment.partition("/")
        dep = api.call("GET", f"/deployments/name/{quote(flow, safe='')}/{quote(name, safe='')}", ok404=True)
        if dep is None:
            raise PrefectAPIError(f"prefect: no deployment {req.deployment!r} at {req.endpoint}; fix: {_SERVE_FIX}")
        try:
            run = api.call("POST", f"/deployments/{dep['id']}/create_flow_run", req.body())
        except PrefectAPIError as e:
            if req.queue and ("work queue" in str(e).lower() or "work pool" in str(e).lower()):
                raise PrefectAPIError(f"{e}; fix: drop -cfg queue (a served deployment has no work pool) or name "
                                      "a queue of the deployment's work pool") from None  # fmt: skip
            raise
        records.save(BACKEND, req.app_id, {
            "endpoint": req.endpoint, "flow_run_id": run["id"], "deployment": req.deployment,
            "deployment_id": dep["id"], "api_key_env": req.api_key_env, "auth_string_env": req.auth_string_env,
            "submitted": time.time(),
        })  # fmt: skip
        return req.app_id

    # -- reading state ---------------------------------------------------------------------
    def _find(self, app_id: str) -> tuple[PrefectAPI, dict[str, Any] | None]:
        """The API that knows ``app_id`` and its flow run (``None``: no such run)."""
        try:
            record = records.load(BACKEND, app_id)
        except ValueError:  # not an id we hand out (a '/' in it...): no record to read
            record = None
        if record is not None:
            api = PrefectAPI(record["endpoint"], record.get("api_key_env"), record.get("auth_string_env"))
            return api, api.flow_run(str(record["flow_run_id"]))
        endpoint = default_endpoint()
        if endpoint is None:
            raise PrefectAPIError(f"prefect: no record of {app_id!r} on this machine and no Prefect API to look it "
                                  f"up; fix: export PREFECT_API_URL=<the API it was submitted to>")  # fmt: skip
        api = PrefectAPI(endpoint)
        return api, api.flow_run(app_id)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        api, run = self._find(app_id)
        if run is None:
            return None
        state = run.get("state") or {}
        kind, name, message = state.get("type"), state.get("name") or "", (state.get("message") or "").strip()
        resp = base.response(app_id, STATES.get(kind or "", AppState.UNKNOWN), f"{name}: {message}" if message else name,
                             ui_url=ui_url(api.endpoint, run["id"]))  # fmt: skip
        resp.roles = roles_of(run.get("parameters"))
        resp.roles_statuses = [  # Prefect knows the run's state, not each replica's: the run's
            RoleStatus(r.name, [ReplicaStatus(i, resp.state, r.name, "") for i in range(r.num_replicas)])
            for r in resp.roles
        ]
        return resp

    def list(self) -> list[ListAppResponse]:
        """The runs this user submitted from this machine (one query per API)."""
        by_api: dict[tuple[str, str, str], dict[str, str]] = {}
        for app_id in records.app_ids(BACKEND):
            rec = records.load(BACKEND, app_id) or {}
            if "endpoint" in rec and "flow_run_id" in rec:
                key = (rec["endpoint"], rec.get("api_key_env", ""), rec.get("auth_string_env", ""))
                by_api.setdefault(key, {})[str(rec["flow_run_id"])] = app_id
        out = []
        for (endpoint, key_env, auth_env), ids in by_api.items():
            states: dict[str, Any] = {}
            try:
                api = PrefectAPI(endpoint, key_env or None, auth_env or None)
                found = api.flow_runs(list(ids))
                states = {r["id"]: (r.get("state") or {}).get("type") for r in found}
            except PrefectAPIError:  # that server is gone: its runs are UNKNOWN
                pass
            out += [ListAppResponse(app_id=a, state=STATES.get(states.get(i) or "", AppState.UNKNOWN))
                    for i, a in ids.items()]  # fmt: skip
        return out

    def _cancel_existing(self, app_id: str) -> None:
        api, run = self._find(app_id)
        if run is None or (run.get("state") or {}).get("type") in (*_FINAL, "CANCELLING"):
            return
        cancelling = {"type": "CANCELLING", "name": "Cancelling", "message": "cancelled with `torchx cancel`"}
        answer = api.call("POST", f"/flow_runs/{run['id']}/set_state", {"state": cancelling, "force": False})
        if (answer or {}).get("status") == "ABORT":
            reason = ((answer or {}).get("details") or {}).get("reason", "")
            raise PrefectAPIError(f"prefect: the server refused to cancel {app_id}: {reason}")

    # -- logs ---------------------------------------------------------------------------
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
        """The flow run's log (one stream): role ``role_name``'s ``[role/rank]`` lines under
        replica 0 — every rank of the role, whatever its replica — with torchstep's events about
        its replicas, and the run's own lines under replica 0 of the first role (the one rule:
        :func:`torchstep.schedulers.base.lines_of_role`); ``should_tail`` follows the
        run until Prefect's state is final."""
        base.check_stream(streams, BACKEND)
        api, run = self._find(app_id)
        if run is None:
            raise ValueError(f"{BACKEND}: no flow run {app_id!r} at {api.endpoint}")
        names = [r.name for r in roles_of(run.get("parameters"))]
        if names and role_name not in names:
            raise ValueError(f"{BACKEND}: app {app_id} has no role {role_name!r}; fix: use one of {names}")
        if k != 0:
            return iter(())  # the log does not keep replicas apart: all of a role's ranks are under replica 0
        seen: set[str] = set()
        after = {"ts": _utc(since) if since else None}

        def fetch(cursor: int, final: bool) -> tuple[list[str], int]:
            logs = api.logs(run["id"], after["ts"])
            new = [log for log in logs if log["id"] not in seen]
            seen.update(log["id"] for log in new)
            flushed["last"] = flushed["last"] or any(_is_last(log) for log in new)
            if new:  # read again from a little before the newest line: late writers are not lost
                newest = max(datetime.fromisoformat(log["timestamp"]) for log in new) - timedelta(seconds=30)
                after["ts"] = max(newest, after["ts"]) if after["ts"] else newest
            text = [line for log in new for line in str(log.get("message", "")).splitlines()]
            return list(base.lines_of_role(text, role_name, names or [role_name])), cursor

        flushed = {"last": False}

        def finished() -> bool:  # final, and its last lines are in (a flow process ships logs late)
            now = api.flow_run(str(run["id"]))
            if now is None or flushed["last"]:
                return True
            if (now.get("state") or {}).get("type") not in _FINAL:
                return False
            end = now.get("end_time")
            return not end or datetime.now(UTC) - datetime.fromisoformat(end) > timedelta(seconds=LOG_GRACE_S)

        tail = should_tail or (run.get("state") or {}).get("type") in _FINAL  # a just-ended run: its last lines
        return base.select_lines(base.follow(fetch, finished, tail=tail, until=until), regex)


def _utc(when: datetime) -> datetime:
    return when.astimezone(UTC)  # a naive time is this machine's local time


def _is_last(log: Mapping[str, Any]) -> bool:
    """The flow engine's last line ("Finished in state ..."): the flow process logged it last."""
    return log.get("task_run_id") is None and str(log.get("message", "")).startswith("Finished in state ")


def create_scheduler(session_name: str, **kwargs: Any) -> PrefectScheduler:
    """The ``torchx.schedulers`` entry point of ``prefect``."""
    return PrefectScheduler(session_name, **kwargs)
