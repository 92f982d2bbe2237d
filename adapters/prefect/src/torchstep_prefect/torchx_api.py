"""The few Prefect REST API calls of the ``prefect`` TorchX scheduler, with one-line errors.

Plain HTTP (``httpx``) rather than Prefect's client: ``torchx status`` stays fast, and the
endpoint and credentials are the scheduler's options, not Prefect's settings. Credentials
are read from the environment variables the options *name*, as Prefect's own client sends
them (an auth string as Basic auth wins over an API key as a Bearer token).

Example::

    >>> ui_url("http://127.0.0.1:4200/api", "0b5c")
    'http://127.0.0.1:4200/runs/flow-run/0b5c'
    >>> api = PrefectAPI("http://127.0.0.1:4200/api")
    >>> api.flow_run("echo-1a2b3c")  # doctest: +SKIP
    {'id': '...', 'name': 'echo-1a2b3c', 'state': {'type': 'COMPLETED', ...}, ...}
"""

from __future__ import annotations

import os
import re
import uuid
from datetime import datetime
from typing import Any

from torchstep.schedulers import base

#: The API's largest page.
PAGE = 200
ENDPOINT_FIX = "give the Prefect API URL: -cfg endpoint=http://HOST:4200/api, or export PREFECT_API_URL"


class PrefectAPIError(RuntimeError):
    """The Prefect API could not do what was asked; the message says why and what to do."""


def check_endpoint(url: str, where: str) -> str:
    """``url`` without its trailing ``/`` when it is an http(s) URL without credentials."""
    return base.check_endpoint(url, where, None, fix=ENDPOINT_FIX
                               + "; credentials go in the variables named by api_key_env / auth_string_env")  # fmt: skip


def default_endpoint() -> str | None:
    """``PREFECT_API_URL`` of the environment, else of the active Prefect profile."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        try:
            from prefect.settings import get_current_settings

            url = get_current_settings().api.url
        except Exception:  # no usable Prefect settings: no default
            url = None
    return check_endpoint(url, "PREFECT_API_URL") if url else None


def ui_url(endpoint: str, flow_run_id: str) -> str:
    """The flow run's page in the Prefect UI (Prefect Cloud, or a server's ``/api`` sibling)."""
    cloud = re.fullmatch(r"https://api\.prefect\.(cloud|dev)/api/accounts/([^/]+)/workspaces/([^/]+)", endpoint)
    if cloud:
        return f"https://app.prefect.{cloud[1]}/account/{cloud[2]}/workspace/{cloud[3]}/runs/flow-run/{flow_run_id}"
    return f"{endpoint.removesuffix('/api')}/runs/flow-run/{flow_run_id}"


class PrefectAPI:
    """Calls to one Prefect API with the credentials the named variables hold (read now)."""

    def __init__(self, endpoint: str, api_key_env: str | None = None, auth_string_env: str | None = None) -> None:
        self.endpoint = endpoint
        self.headers: dict[str, str] = {}
        auth = os.environ.get(auth_string_env or "PREFECT_API_AUTH_STRING")
        key = os.environ.get(api_key_env or "PREFECT_API_KEY")
        if auth:  # as Prefect's own client: the auth string wins over an API key
            import base64

            self.headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
        elif key:
            self.headers["Authorization"] = f"Bearer {key}"

    def call(self, method: str, path: str, body: Any = None, *, ok404: bool = False) -> Any:
        """The JSON answer (``None`` for a 404 when ``ok404``); a one-line PrefectAPIError."""
        import httpx

        try:
            r = httpx.request(method, self.endpoint + path, json=body, headers=self.headers,
                              timeout=httpx.Timeout(30.0, connect=5.0))  # fmt: skip
        except httpx.HTTPError as e:
            raise PrefectAPIError(f"prefect: cannot reach the Prefect API at {self.endpoint} ({type(e).__name__}: "
                                  f"{e}); fix: start the server (`prefect server start`) or {ENDPOINT_FIX}") from None  # fmt: skip
        if r.status_code in (401, 403):
            raise PrefectAPIError(f"prefect: the Prefect API at {self.endpoint} refused the credentials (HTTP "
                                  f"{r.status_code}); fix: export the key in the variable named by -cfg api_key_env "
                                  "(default PREFECT_API_KEY) or auth_string_env (default PREFECT_API_AUTH_STRING)")  # fmt: skip
        if r.status_code == 404 and ok404:
            return None
        try:
            data = r.json() if r.content else None
        except ValueError:
            data = None
        if r.status_code >= 400 or (data is None and r.content):
            detail = data.get("detail", r.text) if isinstance(data, dict) else r.text
            raise PrefectAPIError(f"prefect: {method} {path} -> HTTP {r.status_code}: {str(detail)[:500]}")
        return data

    def flow_run(self, ref: str) -> dict[str, Any] | None:
        """The flow run of id ``ref``, else the newest flow run named ``ref`` (``None``: none)."""
        try:
            run_id = uuid.UUID(ref)
        except ValueError:  # not an id: a name we gave it
            body = {"flow_runs": {"name": {"any_": [ref]}}, "sort": "EXPECTED_START_TIME_DESC", "limit": 1}
            runs = self.call("POST", "/flow_runs/filter", body)
            return runs[0] if runs else None
        return self.call("GET", f"/flow_runs/{run_id}", ok404=True)  # type: ignore[no-any-return]

    def flow_runs(self, ids: list[str]) -> list[dict[str, Any]]:
        """The flow runs of these ids that exist."""
        return [run for i in range(0, len(ids), PAGE) for run in self.call(
            "POST", "/flow_runs/filter", {"flow_runs": {"id": {"any_": ids[i : i + PAGE]}}, "limit": PAGE})]  # fmt: skip

    def logs(self, flow_run_id: str, after: datetime | None = None) -> list[dict[str, Any]]:
        """Every log of the flow run (its tasks' too) from ``after`` on, oldest first."""
        flt: dict[str, Any] = {"flow_run_id": {"any_": [flow_run_id]}}
        if after is not None:
            flt["timestamp"] = {"after_": after.isoformat()}
        out: list[dict[str, Any]] = []
        while True:
            body = {"logs": flt, "sort": "TIMESTAMP_ASC", "offset": len(out), "limit": PAGE}
            page = self.call("POST", "/logs/filter", body)
            out += page
            if len(page) < PAGE:
                return out
