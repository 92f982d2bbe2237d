"""``torchx run -s kfp``: an AppDef as a one-step KFP v2 pipeline run on a KFP endpoint.

``_submit_dryrun`` checks the AppDef for the ``kfp`` target (a SpecError naming the field),
builds its step with :func:`torchstep_kfp.component_from_app` (resources, ``set_retry``,
env, kfp-kubernetes settings, caching off) and compiles a pipeline that calls it once:
the dryrun prints that pipeline YAML, headed by the run's name, experiment, namespace and
endpoint as YAML comments. ``schedule`` submits it with ``kfp.Client`` (the experiment is
created when missing) and hands out the KFP run id as the app id; a private record
(:mod:`torchstep.schedulers.records`) keeps the endpoint, namespace and the *name* of the
variable holding the token, so ``torchx status`` and ``cancel`` work from any process of
the same user (without a record: ``$KF_PIPELINES_ENDPOINT``). KFP's API serves no logs:
``torchx log`` says where they are. kfp is imported only when a pipeline is compiled or
the endpoint is called.

Example::

    export KF_PIPELINES_ENDPOINT=https://kfp.example.com  KF_PIPELINES_TOKEN=...  # token: optional
    torchx run -s kfp --dryrun utils.echo --image ghcr.io/acme/torchstep:1 --msg hi
    torchx run -s kfp -cfg namespace=team-a,experiment=nightly dist.ddp -j 1x2 --script train.py
    torchx status kfp://torchx/0b6f1c1e-2d5c-4a8e-9f3a-7c1d2e3f4a5b
    torchx cancel kfp://torchx/0b6f1c1e-2d5c-4a8e-9f3a-7c1d2e3f4a5b
"""

import contextlib
import copy
import dataclasses
import json
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from torchstep import SpecError
from torchstep.adapter.names import is_dns_subdomain
from torchstep.adapter.torchx import records
from torchstep.adapter.torchx import scheduler as base
from torchx.schedulers.api import DescribeAppResponse
from torchx.specs import AppDef, AppDryRunInfo, AppState

BACKEND = "kfp"
TARGET = "kfp"  # the torchstep target the pipeline's step is planned for
ENDPOINT_ENV = "KF_PIPELINES_ENDPOINT"  # kfp.Client's own variables
UI_ENDPOINT_ENV = "KF_PIPELINES_UI_ENDPOINT"
EXPERIMENT_ENV = "KF_PIPELINES_DEFAULT_EXPERIMENT_NAME"
#: The variable read for a bearer token unless ``token_env`` names another one.
TOKEN_ENV = "KF_PIPELINES_TOKEN"
#: The label KFP's API server puts on every pod of a run (Argo ``podMetadata``); the
#: step's container is ``main``.
RUN_LABEL = "pipeline/runid"
HEALTH_TIMEOUT_S = 10.0
#: KFP run state → TorchX state, and a message for the states TorchX has no name for.
STATES: dict[str, tuple[AppState, str]] = {
    "PENDING": (AppState.PENDING, ""),
    "RUNNING": (AppState.RUNNING, ""),
    "SUCCEEDED": (AppState.SUCCEEDED, ""),
    "SKIPPED": (AppState.SUCCEEDED, "KFP skipped the run (SKIPPED): nothing ran"),
    "FAILED": (AppState.FAILED, ""),
    "CANCELING": (AppState.CANCELLED, "KFP is stopping the run (CANCELING)"),
    "CANCELED": (AppState.CANCELLED, ""),
    "PAUSED": (AppState.PENDING, "the run is paused (PAUSED)"),
}


# -- options ----------------------------------------------------------------------------
OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "endpoint": (str, None, f"KFP API host, https://... (default: ${ENDPOINT_ENV})"),
    "token_env": (
        str,
        None,
        f"NAME of the environment variable holding a bearer token (default: {TOKEN_ENV}, "
        "used when set); never the token itself",
    ),
    "namespace": (str, None, "KFP multi-user namespace (profile); none: single-user"),
    "experiment": (str, None, f"experiment name (default: ${EXPERIMENT_ENV} or Default)"),
    "image": (str, None, "image of every role (must hold torchstep-kfp); default: the AppDef's"),
    "launcher_image": (str, None, "image of the launcher step of a multi-pod AppDef"),
    "caching": (bool, False, "let KFP reuse a cached result of the step (training: no)"),
    "service_account": (str, None, "Kubernetes service account of the run"),
    "pipeline_root": (str, None, "root URI of the run's outputs (default: KFP's)"),
    "ui_endpoint": (str, None, f"KFP UI host for links (default: ${UI_ENDPOINT_ENV} or endpoint)"),
}


@dataclasses.dataclass(frozen=True)
class Connection:
    """Where a run lives: the API endpoint, its multi-user namespace, and the *name* of the
    environment variable holding the bearer token (``None``: no token)."""

    endpoint: str
    token_env: str | None = None
    namespace: str | None = None
    ui_endpoint: str | None = None

    def token(self) -> str | None:
        if self.token_env is None:
            return None
        value = base.secret(self.token_env)
        if value is None:
            raise base.SchedulerError(
                f"kfp: the token variable ${self.token_env} is not set in this process; "
                f"fix: export it (a bearer token for {self.endpoint})"
            )
        return value

    def run_url(self, run_id: str) -> str:
        return f"{self.ui_endpoint or self.endpoint}/#/runs/details/{run_id}"


@dataclasses.dataclass(frozen=True)
class KfpOptions:
    """The checked ``cfg`` of one submission (see :data:`OPTIONS`)."""

    endpoint: str
    token_env: str | None = None
    namespace: str | None = None
    experiment: str = "Default"
    image: str | None = None
    launcher_image: str | None = None
    caching: bool = False
    service_account: str | None = None
    pipeline_root: str | None = None
    ui_endpoint: str | None = None

    @property
    def connection(self) -> Connection:
        return Connection(self.endpoint, self.token_env, self.namespace, self.ui_endpoint)


_FIX = "-cfg {}=https://kfp.example.com (or export {}); a token goes in the variable named by token_env"


def no_endpoint_error() -> SpecError:
    """The error of a submission without an endpoint (a dry run needs none)."""
    return SpecError(
        "cfg['endpoint']", TARGET, "no KFP endpoint to submit to", fix=_FIX.format("endpoint", ENDPOINT_ENV)
    )


def resolve(cfg: Mapping[str, Any], *, need_endpoint: bool = True) -> KfpOptions:
    """``cfg`` (typed, or strings as ``-cfg`` gives them) and kfp.Client's variables checked:
    a SpecError naming ``cfg['<key>']`` and the fix otherwise; a token is never echoed.
    ``need_endpoint=False`` (a dry run): no endpoint is an empty ``endpoint``, not an error."""
    opts = base.parse(cfg, OPTIONS, scheduler=BACKEND, target=TARGET)
    fix = _FIX
    endpoint = opts["endpoint"] or os.environ.get(ENDPOINT_ENV)
    if not endpoint and not need_endpoint:
        opts["endpoint"] = ""
    else:
        opts["endpoint"] = base.endpoint(
            endpoint, api="KFP endpoint", target=TARGET, fix=fix.format("endpoint", ENDPOINT_ENV)
        )
    if ui := opts["ui_endpoint"] or os.environ.get(UI_ENDPOINT_ENV):
        opts["ui_endpoint"] = base.check_endpoint(
            ui, "cfg['ui_endpoint']", TARGET, fix=fix.format("ui_endpoint", UI_ENDPOINT_ENV)
        )
    base.check_secret_var(opts, "token_env", default=None, target=TARGET)
    if opts["token_env"] is None and base.secret(TOKEN_ENV):
        opts["token_env"] = TOKEN_ENV
    base.check_namespace(opts["namespace"], target=TARGET)
    opts["experiment"] = opts["experiment"] or os.environ.get(EXPERIMENT_ENV) or "Default"
    if not opts["experiment"].isprintable():
        raise SpecError("cfg['experiment']", TARGET, "must be a printable name", fix="-cfg experiment=nightly")
    for key in ("image", "launcher_image", "pipeline_root"):
        if opts[key] is not None and any(c.isspace() for c in opts[key]):
            raise SpecError(
                f"cfg[{key!r}]", TARGET, f"{opts[key]!r} must be a value without spaces", fix=f"-cfg {key}=<value>"
            )
    if opts["service_account"] is not None and not is_dns_subdomain(opts["service_account"]):
        raise SpecError(
            "cfg['service_account']",
            TARGET,
            f"{opts['service_account']!r} is not a service account name",
            fix="lower-case letters, digits, '-' and '.': e.g. -cfg service_account=pipeline-runner",
        )
    return KfpOptions(**opts)


# -- the request and the pipeline -------------------------------------------------------
@dataclasses.dataclass
class KfpRequest:
    """What ``schedule`` submits: the compiled pipeline and where and how to run it."""

    pipeline_yaml: str
    run_name: str
    experiment: str
    conn: Connection
    app: dict[str, Any]
    service_account: str | None = None
    pipeline_root: str | None = None

    def __str__(self) -> str:
        c = self.conn
        head = {
            "run": self.run_name,
            "experiment": self.experiment,
            "namespace": c.namespace or "(none: single-user KFP)",
            "endpoint": c.endpoint or f"(none yet: a submission needs -cfg endpoint=... or ${ENDPOINT_ENV})",
            "token": f"${c.token_env}" if c.token_env else "(none)",
            "service_account": self.service_account,
            "pipeline_root": self.pipeline_root,
        }
        return "".join(f"# kfp {k}: {v}\n" for k, v in head.items() if v) + self.pipeline_yaml


def compile_pipeline(app: AppDef, *, name: str, caching: bool = False, launcher_image: str | None = None) -> str:
    """The YAML of a one-step pipeline ``name`` that runs ``app`` (its step built by
    :func:`torchstep_kfp.component_from_app`)."""
    from kfp import compiler, dsl

    from torchstep_kfp.components import component_from_app

    options: dict[str, Any] = {"caching": caching}
    if launcher_image:
        options["launcher_image"] = launcher_image
    step = component_from_app(app, **options)

    @dsl.pipeline(name=name, description=f"torchx run -s kfp: {app.name}")
    def pipeline() -> None:
        step()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pipeline.yaml")
        compiler.Compiler().compile(pipeline, path)
        return Path(path).read_text()


def app_of_pipeline_spec(spec: Any) -> dict[str, Any] | None:
    """The AppDef (JSON data) a torchstep step of a stored pipeline spec runs, if any."""
    if isinstance(spec, Mapping) and "pipeline_spec" in spec:  # {pipeline_spec, platform_spec}
        spec = spec["pipeline_spec"]
    executors = ((spec or {}).get("deploymentSpec") or {}).get("executors") or {}
    for executor in executors.values():
        args = (executor.get("container") or {}).get("args") or []
        if "--spec" in args[:-1]:
            with contextlib.suppress(ValueError, TypeError):
                app = json.loads(args[args.index("--spec") + 1]).get("app")
                if isinstance(app, dict):
                    return app
    return None


# -- the scheduler ----------------------------------------------------------------------
class KfpScheduler(base.TorchstepScheduler, backend=BACKEND, options=OPTIONS):
    """The ``kfp`` TorchX scheduler (see the module docstring)."""

    def __init__(self, session_name: str, **kwargs: Any) -> None:
        super().__init__(session_name, **kwargs)
        self._clients: dict[Connection, Any] = {}

    def _submit_dryrun(self, app: AppDef, cfg: Mapping[str, Any]) -> AppDryRunInfo:
        opts = resolve(cfg, need_endpoint=False)  # a dry run compiles the pipeline: no endpoint needed
        if opts.image:
            app = copy.deepcopy(app)
            for role in app.roles:
                role.image = opts.image
        payload = base.app_payload(app, TARGET)  # SpecError naming the field KFP cannot express
        run_name = base.new_app_id(app.name)
        pipeline_yaml = compile_pipeline(
            app, name=run_name.rsplit("-", 1)[0], caching=opts.caching, launcher_image=opts.launcher_image
        )
        request = KfpRequest(
            pipeline_yaml, run_name, opts.experiment, opts.connection, payload, opts.service_account, opts.pipeline_root
        )
        return AppDryRunInfo(request, str)

    def schedule(self, dryrun_info: AppDryRunInfo) -> str:
        req: KfpRequest = dryrun_info.request
        if not req.conn.endpoint:
            raise no_endpoint_error()
        client = self._client(req.conn)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "pipeline.yaml")
            Path(path).write_text(req.pipeline_yaml)
            with contextlib.redirect_stdout(sys.stderr):  # kfp prints links: stdout is torchx's app handle
                result = self._call(
                    req.conn,
                    "creating the run",
                    client.create_run_from_pipeline_package,
                    path,
                    run_name=req.run_name,
                    experiment_name=req.experiment,
                    namespace=req.conn.namespace,
                    pipeline_root=req.pipeline_root,
                    service_account=req.service_account,
                )
        app_id = records.check_app_id(str(result.run_id))
        record = {
            **dataclasses.asdict(req.conn),
            "run_id": app_id,
            "run_name": req.run_name,
            "experiment": req.experiment,
            "app": req.app,
            "submitted": time.time(),
        }
        records.save(BACKEND, app_id, record)
        return app_id

    # -- where a run lives ---------------------------------------------------------------
    def _where(self, app_id: str) -> tuple[Connection, dict[str, Any]] | None:
        try:
            records.check_app_id(app_id)
        except ValueError:
            return None  # not an id this scheduler hands out
        record = self._record(app_id)
        if record is not None:
            fields = {f.name for f in dataclasses.fields(Connection)}
            return Connection(**{k: v for k, v in record.items() if k in fields}), record
        endpoint = os.environ.get(ENDPOINT_ENV)
        if not endpoint:
            raise base.SchedulerError(
                f"kfp: run {app_id} was not submitted from here (no record) and ${ENDPOINT_ENV} is unset; "
                f"fix: export {ENDPOINT_ENV}=https://<kfp host> (and {TOKEN_ENV} if it needs a token)"
            )
        return resolve({}).connection, {}  # the endpoint, UI and token variable of this environment

    def _client(self, conn: Connection) -> Any:
        if conn not in self._clients:
            token = conn.token()
            probe(conn, token)
            import kfp

            kwargs: dict[str, Any] = {"host": conn.endpoint, "existing_token": token}
            if conn.namespace:
                kwargs["namespace"] = conn.namespace
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP v2.0.0-beta.2 and later"
                self._clients[conn] = self._call(conn, "connecting", kfp.Client, **kwargs)
        return self._clients[conn]

    @staticmethod
    def _call(
        conn: Connection, what: str, fn: Callable[..., Any], *args: Any, missing_ok: bool = False, **kwargs: Any
    ) -> Any:
        """``fn(*args, **kwargs)`` with the API's errors as one-line SchedulerErrors
        (``missing_ok``: ``None`` for HTTP 404)."""
        import kfp_server_api
        import urllib3

        try:
            return fn(*args, **kwargs)
        except kfp_server_api.ApiException as e:
            if missing_ok and e.status == 404:
                return None
            raise api_error(conn, what, e.status, e.body or e.reason) from None
        except urllib3.exceptions.HTTPError as e:
            raise base.SchedulerError(
                f"kfp: {conn.endpoint} is unreachable ({what}: {type(e).__name__}); "
                f"fix: check -cfg endpoint / ${ENDPOINT_ENV} and the network"
            ) from None

    # -- state ---------------------------------------------------------------------------
    def describe(self, app_id: str) -> DescribeAppResponse | None:
        where = self._where(app_id)
        if where is None:
            return None
        conn, record = where
        run = self._call(conn, f"reading run {app_id}", self._client(conn).get_run, app_id, missing_ok=True)
        if run is None:
            return None
        state, msg = STATES.get(str(run.state), (AppState.UNKNOWN, f"KFP state {run.state}"))
        error = getattr(run.error, "message", None)
        if error:
            msg = f"{msg}: {error}" if msg else str(error)
        resp = base.response(app_id, state, msg, ui_url=conn.run_url(app_id))
        resp.roles = base.roles_of(record.get("app") or app_of_pipeline_spec(run.pipeline_spec))
        if len(resp.roles) == 1 and resp.roles[0].num_replicas == 1:  # one pod: the step's state is the run's
            resp.roles_statuses = base.run_role_statuses(resp.roles, state)
        return resp

    def _cancel_existing(self, app_id: str) -> None:
        where = self._where(app_id)
        if where is not None:
            conn = where[0]
            self._call(conn, f"terminating run {app_id}", self._client(conn).terminate_run, app_id)

    def _log_lines(
        self, app_id: str, role_name: str, k: int, *, since: datetime | None, until: datetime | None, tail: bool
    ) -> Iterable[str]:
        """KFP's API serves no logs: raises NotImplementedError saying where they are."""
        conn = None
        with contextlib.suppress(base.SchedulerError):
            found = self._where(app_id)
            conn = found[0] if found else None
        namespace = conn.namespace if conn and conn.namespace else "kubeflow"
        page = conn.run_url(app_id) if conn else "the run's page in the KFP UI"
        raise NotImplementedError(
            f"kfp: the KFP API serves no logs; read the run's pods (the step runs in container 'main') with "
            f"`kubectl logs -n {namespace} -l {RUN_LABEL}={app_id} -c main --prefix --tail=-1` (namespace: the "
            f"run's profile, or KFP's own when single-user) or open {page} → the step → Logs"
        )


def probe(conn: Connection, token: str | None) -> None:
    """Check within ``HEALTH_TIMEOUT_S`` that ``conn.endpoint`` answers as the KFP API
    (``GET /apis/v2beta1/healthz``, the call ``kfp.Client`` makes first and retries for 25 s)."""
    import kfp_server_api

    config = kfp_server_api.Configuration(host=conn.endpoint)
    config.retries = 1
    if token:
        config.api_key["authorization"] = token
        config.api_key_prefix["authorization"] = "Bearer"
    api = kfp_server_api.HealthzServiceApi(kfp_server_api.ApiClient(config))
    resp = KfpScheduler._call(
        conn, "health check", api.healthz_service_get_healthz, _preload_content=False, _request_timeout=HEALTH_TIMEOUT_S
    )
    data = None
    with contextlib.suppress(ValueError):
        data = json.loads(resp.data)
    if not isinstance(data, dict):
        raise base.SchedulerError(
            f"kfp: {conn.endpoint} did not answer as the KFP API (GET /apis/v2beta1/healthz gave no JSON: a "
            f"login page?); fix: point endpoint at the KFP API and put a bearer token in ${TOKEN_ENV} or -cfg token_env"
        )


def api_error(conn: Connection, what: str, status: Any, body: Any) -> base.SchedulerError:
    """A one-line error for an HTTP error of the KFP API (its ``message`` when JSON)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    with contextlib.suppress(ValueError, AttributeError):
        data = json.loads(text)
        text = data.get("message") or data.get("error") or text
    text = " ".join(text.split())[:300]
    if status in (401, 403):
        token = f"${conn.token_env}" if conn.token_env else f"no token: set ${TOKEN_ENV} or -cfg token_env"
        fix = f"check the token ({token}) and the namespace ({conn.namespace or 'none'}: -cfg namespace)"
    else:
        fix = (
            "check the endpoint's TLS certificate" if status == 0 else "see the message; check namespace and experiment"
        )
    return base.SchedulerError(
        f"kfp: {conn.endpoint} refused {what} (HTTP {status}): {text}; fix: {fix}",
        status=status if isinstance(status, int) else None,
    )


def create_scheduler(session_name: str, **kwargs: Any) -> KfpScheduler:
    """The ``torchx.schedulers`` entry point of ``kfp``."""
    return KfpScheduler(session_name, **kwargs)
