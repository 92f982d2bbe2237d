"""The REST client of the Airflow and Prefect TorchX schedulers
(:class:`torchstep.schedulers.rest.RestClient`) against a real HTTP server on 127.0.0.1
(the standard library's ``http.server``) that answers as a busy or flaky API does: 503 with
``Retry-After``, 429, a connection closed before the answer, a restart, a login page."""

from __future__ import annotations

import doctest
import importlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from torchstep.schedulers.base import SchedulerError
from torchstep.schedulers.rest import RestClient, RetryPolicy

FAST = RetryPolicy(backoff_s=0.05, jitter=0.0)
#: What the server does with one request: (status, headers, body) to answer, or DROP to do
#: the request and close the connection without answering.
DROP = "drop"
Reply = tuple[int, dict[str, str], Any] | str


class Api:
    """A small JSON API: ``POST /things`` creates a thing named in the body (409 when the
    name exists, as Airflow's dagRuns; or the existing thing when ``dedupe``, as Prefect's
    idempotency key), ``GET /things/<name>``; ``script`` overrides the next answers."""

    def __init__(self, *, dedupe: bool = False) -> None:
        self.things: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, float]] = []
        self.script: list[Reply] = []
        self.dedupe = dedupe
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.serve(self)

            do_POST = do_PATCH = do_GET

        self.handler = Handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.start()

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def restart(self, after: float) -> None:
        """Down now (connections refused), up again on the same port ``after`` seconds later."""
        self.stop()

        def up() -> None:
            self.server = ThreadingHTTPServer(("127.0.0.1", self.port), self.handler)
            self.start()

        threading.Timer(after, up).start()

    def serve(self, h: BaseHTTPRequestHandler) -> None:
        self.requests.append((h.command, h.path, time.monotonic()))
        length = int(h.headers.get("Content-Length") or 0)
        body = json.loads(h.rfile.read(length)) if length else None
        reply = self.script.pop(0) if self.script else None
        if reply == DROP or reply is None:
            reply2 = self.route(h.command, h.path, body)
            if reply == DROP:  # done, and the answer lost on the way
                h.close_connection = True
                return
            reply = reply2
        status, headers, out = reply  # type: ignore[misc]
        data = out.encode() if isinstance(out, str) else json.dumps(out).encode()
        h.send_response(status)
        for k, v in {"Content-Type": "application/json", **headers}.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def route(self, method: str, path: str, body: Any) -> tuple[int, dict[str, str], Any]:
        if method == "POST" and path == "/things":
            name = body["name"]
            if name in self.things:
                return (200, {}, self.things[name]) if self.dedupe else (409, {}, {"detail": f"{name} exists"})
            self.things[name] = {"name": name, "n": len(self.things) + 1}
            return 201, {}, self.things[name]
        if method == "GET" and path.startswith("/things/"):
            thing = self.things.get(path.rsplit("/", 1)[1])
            return (200, {}, thing) if thing else (404, {}, {"detail": "not found"})
        return 404, {}, {"detail": f"no route {method} {path}"}


@pytest.fixture()
def api() -> Iterator[Api]:
    server = Api()
    yield server
    server.stop()


def test_a_busy_answer_is_retried_after_the_time_retry_after_asks(api: Api) -> None:
    api.things["a"] = {"name": "a"}
    api.script = [(503, {"Retry-After": "1"}, {"detail": "database is locked"})]
    client = RestClient(api.url, retry=RetryPolicy(jitter=0.0))
    assert client.call("GET", "/things/a") == {"name": "a"}
    (_, _, first), (_, _, second) = api.requests
    assert second - first >= 1.0  # Retry-After honoured, not the backoff's first step


def test_rate_limited_and_bad_gateway_answers_back_off_until_the_api_answers(api: Api) -> None:
    api.things["a"] = {"name": "a"}
    api.script = [(429, {}, {}), (502, {}, "<html>bad gateway</html>"), (503, {}, {})]
    assert RestClient(api.url, retry=FAST).call("GET", "/things/a") == {"name": "a"}
    gaps = [b[2] - a[2] for a, b in zip(api.requests, api.requests[1:], strict=False)]
    assert len(gaps) == 3 and gaps[0] >= 0.05 and gaps[1] >= 0.1 and gaps[2] >= 0.2  # doubled each time


def test_retries_end_with_the_last_answer_named(api: Api) -> None:
    api.script = [(503, {}, {"detail": "busy"})] * 10
    with pytest.raises(SchedulerError, match=r"GET /things/a: HTTP 503 \(after 3 tries\): busy") as err:
        RestClient(api.url, retry=RetryPolicy(retries=2, backoff_s=0.01)).call("GET", "/things/a")
    assert err.value.status == 503 and len(api.requests) == 3


def test_a_retry_after_longer_than_a_cli_waits_is_not_waited_for(api: Api) -> None:
    api.script = [(503, {"Retry-After": "3600"}, {"detail": "maintenance"})]
    t0 = time.monotonic()
    with pytest.raises(SchedulerError, match="HTTP 503: maintenance"):
        RestClient(api.url).call("GET", "/things/a")
    assert time.monotonic() - t0 < 5 and len(api.requests) == 1


def test_a_call_that_is_not_idempotent_is_never_repeated(api: Api) -> None:
    api.script = [(503, {"Retry-After": "0"}, {"detail": "busy"})]
    with pytest.raises(SchedulerError, match="HTTP 503"):
        RestClient(api.url, retry=FAST).call("POST", "/things", {"name": "x"})
    assert len(api.requests) == 1


def test_a_create_whose_answer_was_lost_is_retried_without_a_second_object(api: Api) -> None:
    # Airflow: the caller chose the name; the retry gets 409 and the existing object is ours
    api.script = [DROP]
    client = RestClient(api.url, retry=FAST)
    got = client.call(
        "POST", "/things", {"name": "run-1"}, idempotent=True, on_conflict=lambda: client.call("GET", "/things/run-1")
    )
    assert got == {"name": "run-1", "n": 1} and list(api.things) == ["run-1"]
    assert [r[:2] for r in api.requests] == [("POST", "/things"), ("POST", "/things"), ("GET", "/things/run-1")]


def test_a_create_with_an_idempotency_key_answers_the_first_object_on_retry() -> None:
    api = Api(dedupe=True)  # Prefect: the idempotency key returns the run the first try made
    try:
        api.script = [DROP]
        got = RestClient(api.url, retry=FAST).call("POST", "/things", {"name": "run-1"}, idempotent=True)
        assert got == {"name": "run-1", "n": 1} and len(api.things) == 1 and len(api.requests) == 2
    finally:
        api.stop()


def test_a_conflict_on_the_first_try_is_an_error_not_someone_elses_object(api: Api) -> None:
    api.things["run-1"] = {"name": "run-1", "n": 1}
    called: list[int] = []
    with pytest.raises(SchedulerError, match=r"POST /things: HTTP 409: run-1 exists"):
        RestClient(api.url, retry=FAST).call(
            "POST", "/things", {"name": "run-1"}, idempotent=True, on_conflict=lambda: called.append(1)
        )
    assert not called


def test_a_lost_answer_of_a_create_that_is_not_idempotent_says_it_may_have_been_done(api: Api) -> None:
    api.script = [DROP]
    with pytest.raises(
        SchedulerError, match=r"connection .* was lost before the answer.*may or may not have been done"
    ):
        RestClient(api.url, retry=FAST).call("POST", "/things", {"name": "x"})
    assert len(api.requests) == 1


def test_a_server_that_never_answered_fails_at_once_one_that_restarts_is_waited_for(api: Api) -> None:
    down = Api()
    down.stop()
    t0 = time.monotonic()
    with pytest.raises(SchedulerError, match=r"cannot reach the API at http://127.0.0.1:\d+ \(.*refused"):
        RestClient(down.url).call("GET", "/things/a")
    assert time.monotonic() - t0 < 2  # a wrong URL is not retried for a minute

    api.things["a"] = {"name": "a"}
    client = RestClient(api.url, retry=RetryPolicy(backoff_s=0.2, jitter=0.0))
    assert client.call("GET", "/things/a") == {"name": "a"}  # it answered once ...
    api.restart(after=0.5)
    assert client.call("GET", "/things/a") == {"name": "a"}  # ... so a restart is waited for


def test_errors_name_the_call_and_never_the_credentials(api: Api) -> None:
    class Secured(RestClient):
        backend, api = "demo", "Demo API"

        def auth_fix(self) -> str:
            return "export DEMO_TOKEN"

    client = Secured(api.url, retry=FAST)
    client.headers["Authorization"] = "Bearer s3cr3t-t0ken"
    api.script = [(401, {}, {"detail": "bad token"})]
    with pytest.raises(SchedulerError) as err:
        client.call("GET", "/things/a")
    assert str(err.value) == (
        f"demo: the Demo API at {api.url} refused the credentials (GET /things/a: HTTP 401); fix: export DEMO_TOKEN"
    )
    api.script = [(200, {"Content-Type": "text/html"}, "<html>Sign in</html>")]
    with pytest.raises(
        SchedulerError, match=r"answer is not JSON .*login page.*fix: point the endpoint at the Demo API"
    ):
        client.call("GET", "/things/a")
    assert client.call("GET", "/things/a", ok404=True) is None


@pytest.mark.parametrize("name", ["torchstep.schedulers.base", "torchstep.schedulers.rest", "torchstep.plan.options"])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
