"""``torchx run -s prefect``: an AppDef as a flow run of the generic ``torchstep-torchx`` flow.

``schedule`` checks the AppDef for the target that will run it, then creates a flow run of a
deployment of :func:`torchstep_prefect.torchx_flow.torchx_app` through the Prefect REST API
(``POST /deployments/{id}/create_flow_run``) with the AppDef as JSON data in its parameters;
the flow run runs it through :func:`~torchstep_prefect.app_task` (retries, timeouts,
cancellation, each rank's lines in the run's log). The flow run is named after the app id
(``<app>-<6 chars>``), which is also its idempotency key: a submission whose answer was lost
is retried without a second run. A private record (:mod:`torchstep.schedulers.records`) keeps
the endpoint, the flow run id and the *names* of the credential variables, so ``torchx
status``, ``log``, ``cancel`` and ``list`` work from any process; without a record (another
machine) they look the run up by name on ``PREFECT_API_URL``. ``cancel`` sets the run
Cancelling like ``prefect flow-run cancel``: the runner stops the flow and every process of
the step.

The REST calls are plain HTTP (:class:`torchstep.schedulers.rest.RestClient`) rather than
Prefect's client: ``torchx status`` stays fast, and the endpoint and credentials are the
scheduler's options, not Prefect's settings. Credentials are read from the environment
variables the options *name*, as Prefect's own client sends them (an auth string as Basic
auth wins over an API key as a Bearer token).

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

import base64
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from torchx.schedulers.api import DescribeAppResponse, ListAppResponse
from torchx.specs import AppDef, AppDryRunInfo, AppState, Role

from torchstep.errors import SpecError
from torchstep.schedulers import base, generic, records, rest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser as a backport (a dependency of torchstep there)
    import tomli as tomllib

BACKEND = "prefect"
FLOW_NAME = "torchstep-torchx"  # torchx_flow.FLOW_NAME (that module imports prefect)
DEFAULT_DEPLOYMENT = f"{FLOW_NAME}/torchx"
#: Prefect state type -> TorchX AppState (a run being cancelled is already CANCELLED to TorchX).
STATES = {
    "SCHEDULED": AppState.SUBMITTED,
    "PENDING": AppState.PENDING,
    "PAUSED": AppState.PENDING,
    "RUNNING": AppState.RUNNING,
    "COMPLETED": AppState.SUCCEEDED,
    "FAILED": AppState.FAILED,
    "CRASHED": AppState.FAILED,
    "CANCELLING": AppState.CANCELLED,
    "CANCELLED": AppState.CANCELLED,
}
_FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")  # Prefect's final states: no more logs
#: Seconds after a flow run's end until its log is taken as complete (Prefect ships logs in
#: batches every 2 s; the flow engine's "Finished in state" line ends it sooner).
LOG_GRACE_S = 10.0
#: The API's largest page.
PAGE = 200
ENDPOINT_FIX = "give the Prefect API URL: -cfg endpoint=http://HOST:4200/api, or export PREFECT_API_URL"
_SERVE_FIX = (
    "serve it (`python -m torchstep_prefect.torchx_flow serve --name torchx` with PREFECT_API_URL set) "
    "or deploy the flow to a work pool, or name your deployment with -cfg deployment=FLOW/NAME"
)


# -- options ----------------------------------------------------------------------------
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "endpoint": (
        str,
        None,
        "Prefect API URL, e.g. http://127.0.0.1:4200/api (default: PREFECT_API_URL of the "
        "environment, else of the active Prefect profile)",
    ),
    "api_key_env": (
        str,
        "PREFECT_API_KEY",
        "NAME of the environment variable holding a Prefect Cloud API key "
        "(sent as a Bearer token when set; never the key itself)",
    ),
    "auth_string_env": (
        str,
        "PREFECT_API_AUTH_STRING",
        "NAME of the environment variable holding a self-hosted "
        "server's 'user:password' (Basic auth when set; never the value itself)",
    ),
    "deployment": (
        str,
        DEFAULT_DEPLOYMENT,
        "deployment of the torchstep-torchx flow, FLOW/NAME "
        "(`python -m torchstep_prefect.torchx_flow serve --name NAME`)",
    ),
    "queue": (str, None, "work queue of the flow run (a work-pool deployment only; default: the deployment's)"),
    "tags": (list, None, "tags of the flow run, ';'-separated"),
    "target": (str, "local", "where the step runs: local (on the machine of the flow run) or kubernetes (Jobs)"),
    "namespace": (str, None, "Kubernetes namespace of the step's Jobs (target=kubernetes only; default: default)"),
}


@dataclass(frozen=True)
class PrefectOptions:
    """The checked ``cfg`` of one submission (see :data:`OPTIONS`)."""

    endpoint: str
    api_key_env: str = "PREFECT_API_KEY"
    auth_string_env: str = "PREFECT_API_AUTH_STRING"
    deployment: str = DEFAULT_DEPLOYMENT
    queue: str | None = None
    tags: tuple[str, ...] = ()
    target: str = "local"
    namespace: str | None = None


def _parse_time(stamp: str) -> datetime:
    """A time of Prefect's API (``2026-11-27T10:55:12.929000Z``); Python 3.10's
    ``fromisoformat`` does not read the ``Z`` suffix."""
    return datetime.fromisoformat(stamp[:-1] + "+00:00" if stamp.endswith("Z") else stamp)


def resolve(cfg: Mapping[str, Any]) -> PrefectOptions:
    """``cfg`` (typed, or strings as ``-cfg`` gives them) checked: a SpecError naming
    ``cfg['<key>']`` and the fix otherwise; a credential *value* is never echoed."""
    opts = base.parse(cfg, OPTIONS, scheduler=BACKEND, target=None)
    for key in ("api_key_env", "auth_string_env"):
        base.check_secret_var(opts, key, default=OPTIONS[key][1], target=None)
    base.check_step_target(opts["target"], opts["namespace"])
    flow, sep, name = opts["deployment"].partition("/")
    if not sep or not flow or not name or "/" in name:
        raise SpecError(
            "cfg['deployment']",
            None,
            f"{opts['deployment']!r} is not FLOW/NAME",
            fix=f"e.g. -cfg deployment={DEFAULT_DEPLOYMENT}",
        )
    opts["endpoint"] = base.endpoint(
        opts["endpoint"] or default_endpoint(),
        api="Prefect API",
        target=None,
        fix=f"{ENDPOINT_FIX}; credentials go in the variables named by api_key_env / auth_string_env",
    )
    opts["tags"] = tuple(opts["tags"] or ())
    return PrefectOptions(**opts)


def default_endpoint() -> str | None:
    """``PREFECT_API_URL`` of the environment, else of the active Prefect profile, read as
    Prefect reads it but without importing Prefect (submitting needs no Prefect install):
    the profile named by ``PREFECT_PROFILE``, else the file's ``active`` one, in
    ``$PREFECT_PROFILES_PATH`` (default ``$PREFECT_HOME/profiles.toml``, ``~/.prefect``)."""
    url = os.environ.get("PREFECT_API_URL") or _profile_setting("PREFECT_API_URL")
    return base.check_endpoint(url, "PREFECT_API_URL", None, fix=ENDPOINT_FIX) if url else None


def _profile_setting(name: str) -> str | None:
    home = os.environ.get("PREFECT_HOME") or os.path.join("~", ".prefect")
    path = os.path.expanduser(os.environ.get("PREFECT_PROFILES_PATH") or os.path.join(home, "profiles.toml"))
    try:
        with open(path, "rb") as f:
            profiles = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):  # no profiles, or a broken file: no default
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    value = (profiles.get("profiles") or {}).get(active, {}).get(name)
    return str(value) if value else None


# -- the request and the API ------------------------------------------------------------
@dataclass
class PrefectRequest:
    """What ``schedule`` sends: a flow run of ``deployment`` with these parameters."""

    app_id: str
    endpoint: str
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
            f"prefect: POST {self.endpoint}/deployments/{{id of {self.deployment}}}/create_flow_run\n"
            f"  (id from GET /deployments/name/{flow}/{name}; credentials: ${self.auth_string_env} or "
            f"${self.api_key_env} when set)\n{json.dumps(self.body(), indent=1, sort_keys=True)}"
        )


class PrefectAPI(rest.RestClient):
    """The Prefect REST API with the credentials the named variables hold (read now)."""

    backend = BACKEND
    api = "Prefect API"

    def __init__(self, endpoint: str, api_key_env: str | None = None, auth_string_env: str | None = None) -> None:
        super().__init__(endpoint)
        auth = base.secret(auth_string_env or OPTIONS["auth_string_env"][1])
        key = base.secret(api_key_env or OPTIONS["api_key_env"][1])
        if auth:  # as Prefect's own client: the auth string wins over an API key
            self.headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
        elif key:
            self.headers["Authorization"] = f"Bearer {key}"

    def unreachable_fix(self) -> str:
        return f"start the server (`prefect server start`) or {ENDPOINT_FIX}"

    def auth_fix(self) -> str:
        return (
            "export the key in the variable named by -cfg api_key_env (default PREFECT_API_KEY) or "
            "auth_string_env (default PREFECT_API_AUTH_STRING)"
        )

    def flow_run(self, ref: str) -> dict[str, Any] | None:
        """The flow run of id ``ref``, else the newest flow run named ``ref`` (``None``: none)."""
        try:
            run_id = uuid.UUID(ref)
        except ValueError:  # not an id: a name we gave it
            body = {"flow_runs": {"name": {"any_": [ref]}}, "sort": "EXPECTED_START_TIME_DESC", "limit": 1}
            runs = self.call("POST", "/flow_runs/filter", body, idempotent=True)
            return runs[0] if runs else None
        return self.call("GET", f"/flow_runs/{run_id}", ok404=True)  # type: ignore[no-any-return]

    def flow_runs(self, ids: list[str]) -> list[dict[str, Any]]:
        """The flow runs of these ids that exist."""
        return [
            run
            for i in range(0, len(ids), PAGE)
            for run in self.call(
                "POST",
                "/flow_runs/filter",
                {"flow_runs": {"id": {"any_": ids[i : i + PAGE]}}, "limit": PAGE},
                idempotent=True,
            )
        ]

    def logs(self, flow_run_id: str, after: datetime | None = None) -> list[dict[str, Any]]:
        """Every log of the flow run (its tasks' too) from ``after`` on, oldest first."""
        flt: dict[str, Any] = {"flow_run_id": {"any_": [flow_run_id]}}
        if after is not None:
            flt["timestamp"] = {"after_": after.isoformat()}
        out: list[dict[str, Any]] = []
        while True:
            body = {"logs": flt, "sort": "TIMESTAMP_ASC", "offset": len(out), "limit": PAGE}
            page = self.call("POST", "/logs/filter", body, idempotent=True)
            out += page
            if len(page) < PAGE:
                return out


def ui_url(endpoint: str, flow_run_id: str) -> str:
    """The flow run's page in the Prefect UI (Prefect Cloud, or a server's ``/api`` sibling).

    >>> ui_url("http://127.0.0.1:4200/api", "0b5c")
    'http://127.0.0.1:4200/runs/flow-run/0b5c'
    """
    cloud = re.fullmatch(r"https://api\.prefect\.(cloud|dev)/api/accounts/([^/]+)/workspaces/([^/]+)", endpoint)
    if cloud:
        return f"https://app.prefect.{cloud[1]}/account/{cloud[2]}/workspace/{cloud[3]}/runs/flow-run/{flow_run_id}"
    return f"{endpoint.removesuffix('/api')}/runs/flow-run/{flow_run_id}"


def roles_of(parameters: Any) -> list[Role]:
    """The roles (name, replicas) of the AppDef in a flow run's parameters."""
    return base.roles_of(parameters.get("app") if isinstance(parameters, dict) else None, lenient=True)


# -- the scheduler ----------------------------------------------------------------------
class PrefectScheduler(base.TorchstepScheduler, backend=BACKEND, options=OPTIONS):
    """The ``prefect`` TorchX scheduler (see the module docstring)."""

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        opts = resolve(cfg)
        app_id = base.new_app_id(app.name)
        step_cfg = {"namespace": opts.namespace} if opts.namespace else {}
        request = PrefectRequest(
            app_id=app_id,
            endpoint=opts.endpoint,
            deployment=opts.deployment,
            parameters=generic.step_conf(app, opts.target, step_cfg, app_id=app_id),  # SpecError naming the field
            queue=opts.queue,
            tags=list(opts.tags),
            api_key_env=opts.api_key_env,
            auth_string_env=opts.auth_string_env,
        )
        return AppDryRunInfo(request, str)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        req: PrefectRequest = dryrun_info.request
        api = PrefectAPI(req.endpoint, req.api_key_env, req.auth_string_env)
        flow, _, name = req.deployment.partition("/")
        dep = api.call("GET", f"/deployments/name/{rest.segment(flow)}/{rest.segment(name)}", ok404=True)
        if dep is None:
            raise base.SchedulerError(f"prefect: no deployment {req.deployment!r} at {req.endpoint}; fix: {_SERVE_FIX}")
        try:  # the idempotency key makes a repeated create return the run the first one made
            run = api.call("POST", f"/deployments/{dep['id']}/create_flow_run", req.body(), idempotent=True)
        except base.SchedulerError as e:
            if req.queue and ("work queue" in str(e).lower() or "work pool" in str(e).lower()):
                raise base.SchedulerError(
                    f"{e}; fix: drop -cfg queue (a served deployment has no work pool) or "
                    "name a queue of the deployment's work pool"
                ) from None
            raise
        records.save(
            BACKEND,
            req.app_id,
            {
                "endpoint": req.endpoint,
                "flow_run_id": run["id"],
                "deployment": req.deployment,
                "deployment_id": dep["id"],
                "api_key_env": req.api_key_env,
                "auth_string_env": req.auth_string_env,
                "submitted": time.time(),
            },
        )
        return req.app_id

    # -- reading state ---------------------------------------------------------------------
    def _find(self, app_id: str) -> tuple[PrefectAPI, dict[str, Any] | None]:
        """The API that knows ``app_id`` and its flow run (``None``: no such run)."""
        record = self._record(app_id)
        if record is not None:
            api = PrefectAPI(record["endpoint"], record.get("api_key_env"), record.get("auth_string_env"))
            return api, api.flow_run(str(record["flow_run_id"]))
        endpoint = default_endpoint()
        if endpoint is None:
            raise base.SchedulerError(
                f"prefect: no record of {app_id!r} on this machine and no Prefect API to look "
                "it up; fix: export PREFECT_API_URL=<the API it was submitted to>"
            )
        api = PrefectAPI(endpoint)
        return api, api.flow_run(app_id)

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        api, run = self._find(app_id)
        if run is None:
            return None
        state = run.get("state") or {}
        kind, name, message = state.get("type"), state.get("name") or "", (state.get("message") or "").strip()
        resp = base.response(
            app_id,
            STATES.get(kind or "", AppState.UNKNOWN),
            f"{name}: {message}" if message else name,
            ui_url=ui_url(api.endpoint, run["id"]),
        )
        resp.roles = roles_of(run.get("parameters"))
        resp.roles_statuses = base.run_role_statuses(resp.roles, resp.state)  # Prefect knows the run's state only
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
                found = PrefectAPI(endpoint, key_env or None, auth_env or None).flow_runs(list(ids))
                states = {r["id"]: (r.get("state") or {}).get("type") for r in found}
            except base.SchedulerError:  # that server is gone: its runs are UNKNOWN
                pass
            out += [
                ListAppResponse(app_id=a, state=STATES.get(states.get(i) or "", AppState.UNKNOWN))
                for i, a in ids.items()
            ]
        return out

    def _cancel_existing(self, app_id: str) -> None:
        api, run = self._find(app_id)
        if run is None or (run.get("state") or {}).get("type") in (*_FINAL, "CANCELLING"):
            return
        cancelling = {"type": "CANCELLING", "name": "Cancelling", "message": "cancelled with `torchx cancel`"}
        answer = (
            api.call(
                "POST", f"/flow_runs/{run['id']}/set_state", {"state": cancelling, "force": False}, idempotent=True
            )
            or {}
        )
        if answer.get("status") == "ABORT":  # refused; or an earlier try of this call made it Cancelling
            now = (api.flow_run(str(run["id"])) or {}).get("state") or {}
            if now.get("type") not in (*_FINAL, "CANCELLING"):
                reason = (answer.get("details") or {}).get("reason", "")
                raise base.SchedulerError(f"prefect: the server refused to cancel {app_id}: {reason}")

    # -- logs ---------------------------------------------------------------------------
    def _log_lines(
        self, app_id: str, role_name: str, k: int, *, since: datetime | None, until: datetime | None, tail: bool
    ) -> Iterable[str]:
        """The flow run's log (one stream): role ``role_name``'s ``[role/rank]`` lines under
        replica 0 — every rank of the role, whatever its replica — with torchstep's events about
        its replicas, and the run's own lines under replica 0 of the first role (the one rule:
        :func:`torchstep.schedulers.base.lines_of_role`); ``tail`` follows the run until
        Prefect's state is final."""
        api, run = self._find(app_id)
        if run is None:
            raise ValueError(f"{BACKEND}: no flow run {app_id!r} at {api.endpoint}")
        names = [r.name for r in roles_of(run.get("parameters"))]
        if names and role_name not in names:
            raise ValueError(f"{BACKEND}: app {app_id} has no role {role_name!r}; fix: use one of {names}")
        if k != 0:
            return iter(())  # the log does not keep replicas apart: all of a role's ranks are under replica 0
        seen: set[str] = set()
        after = {"ts": since.astimezone(timezone.utc) if since else None}  # a naive time is this machine's local time
        flushed = {"last": False}

        def fetch(cursor: int, final: bool) -> tuple[list[str], int]:
            logs = api.logs(run["id"], after["ts"])
            new = [log for log in logs if log["id"] not in seen]
            seen.update(log["id"] for log in new)
            flushed["last"] = flushed["last"] or any(_is_last(log) for log in new)
            if new:  # read again from a little before the newest line: late writers are not lost
                newest = max(_parse_time(log["timestamp"]) for log in new) - timedelta(seconds=30)
                after["ts"] = max(newest, after["ts"]) if after["ts"] else newest
            text = [line for log in new for line in str(log.get("message", "")).splitlines()]
            return list(base.lines_of_role(text, role_name, names or [role_name])), cursor

        def finished() -> bool:  # final, and its last lines are in (a flow process ships logs late)
            now = api.flow_run(str(run["id"]))
            if now is None or flushed["last"]:
                return True
            if (now.get("state") or {}).get("type") not in _FINAL:
                return False
            end = now.get("end_time")
            return not end or datetime.now(timezone.utc) - _parse_time(end) > timedelta(seconds=LOG_GRACE_S)

        tail = tail or (run.get("state") or {}).get("type") in _FINAL  # a just-ended run: its last lines
        return base.follow(fetch, finished, tail=tail, until=until)


def _is_last(log: Mapping[str, Any]) -> bool:
    """The flow engine's last line ("Finished in state ..."): the flow process logged it last."""
    return log.get("task_run_id") is None and str(log.get("message", "")).startswith("Finished in state ")


def create_scheduler(session_name: str, **kwargs: Any) -> PrefectScheduler:
    """The ``torchx.schedulers`` entry point of ``prefect``."""
    return PrefectScheduler(session_name, **kwargs)
