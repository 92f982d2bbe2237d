"""The store witness's client (``torchstep.agent.witness``) against the answers an API server
gives that the one-machine cluster's pods do not meet: a refusal (no RBAC for leases), a
server that does not answer, a write that loses a race, and names that are not object names.
The claims through a real in-cluster API, from pods, are in tests/cluster/test_store_witness.py."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from torchstep.agent.witness import LeaseWitness, lease_name


class Api:
    """A scripted API server: each request is answered by ``answer(method, path, body)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.answer: Any = lambda method, path, body: (404, {})
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n)) if n else None
                api.calls.append((self.command, self.path, body))
                code, out = api.answer(self.command, self.path, body)
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def witness(self) -> LeaseWitness:
        return LeaseWitness(self.url, "ml", "run-1", "tok", ssl.create_default_context())


@pytest.fixture
def api() -> Iterator[Api]:
    a = Api()
    yield a
    a.server.shutdown()


def test_a_service_account_without_lease_rights_is_named_at_start_with_the_fix(api: Api) -> None:
    api.answer = lambda m, p, b: (403, {"message": 'leases.coordination.k8s.io "x" is forbidden'})
    problem = api.witness().check()
    assert problem is not None
    assert "403" in problem and "forbidden" in problem and "get, create and update on leases" in problem
    assert not api.witness().claim("e#1", "me", timeout_s=2)  # and a claim is lost, never an error


def test_a_server_that_does_not_answer_loses_the_claim_within_its_bound() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        w = LeaseWitness(f"http://127.0.0.1:{silent.getsockname()[1]}", "ml", "r", "t", ssl.create_default_context())
        t0 = time.monotonic()
        assert w.claim("e#1", "me", timeout_s=1.5) is False
        assert time.monotonic() - t0 < 4.5
        assert "did not answer" in (w.check(timeout_s=0.5) or "")


def test_a_write_that_loses_the_race_reads_again_and_the_winner_is_respected(api: Api) -> None:
    """Both halves read the old split's Lease; the other half's write got in first (409): this
    half reads again, sees the split decided for the other, and loses without writing."""
    old = {"metadata": {"resourceVersion": "5", "annotations": {"torchstep.io/split": "h:1#2"}}, "spec": {}}
    new = {
        "metadata": {"resourceVersion": "6", "annotations": {"torchstep.io/split": "h:1#3"}},
        "spec": {"holderIdentity": "other"},
    }
    reads = iter([old, new])

    def answer(method: str, path: str, body: Any) -> tuple[int, Any]:
        if method == "GET":
            return 200, next(reads)
        return 409, {"reason": "Conflict"}

    api.answer = answer
    assert api.witness().claim("h:1#3", "me") is False
    assert [c[0] for c in api.calls] == ["GET", "PUT", "GET"]
    put = api.calls[1][2]
    assert put["metadata"]["resourceVersion"] == "5"  # the write was conditional on what it read
    assert put["spec"]["holderIdentity"] == "me" and put["metadata"]["annotations"]["torchstep.io/split"] == "h:1#3"


def test_a_busy_server_is_asked_again_within_the_bound_and_a_refusal_is_not(api: Api) -> None:
    answers = iter([(503, {}), (429, {}), (404, {})])
    api.answer = lambda m, p, b: next(answers) if m == "GET" else (201, b)
    assert api.witness().claim("e#1", "me", timeout_s=5) is True  # 503 and 429: read again
    api.calls.clear()
    api.answer = lambda m, p, b: (404, {}) if m == "GET" else (422, {"reason": "Invalid"})
    assert api.witness().claim("e#1", "me", timeout_s=5) is False
    assert [c[0] for c in api.calls] == ["GET", "POST"]  # a refusal ends the claim at once


def test_the_first_claim_creates_the_lease_with_the_split_and_the_holder(api: Api) -> None:
    api.answer = lambda m, p, b: (404, {}) if m == "GET" else (201, b)
    assert api.witness().claim("h:29400#0", "node-a") is True
    method, path, body = api.calls[-1]
    assert method == "POST" and path == "/apis/coordination.k8s.io/v1/namespaces/ml/leases"
    assert body["metadata"] == {
        "name": "torchstep-store-run-1",
        "labels": {"app.kubernetes.io/managed-by": "torchstep"},
        "annotations": {"torchstep.io/split": "h:29400#0"},
    }
    assert body["spec"]["holderIdentity"] == "node-a"


def test_lease_names_are_valid_object_names() -> None:
    assert lease_name("Job_1") == "torchstep-store-job-1"
    long = lease_name("x" * 300)
    assert len(long) <= 63 and long.startswith("torchstep-store-x")
    assert lease_name("x" * 300) != lease_name("x" * 299)
    assert lease_name("../..") == "torchstep-store-run"


def test_outside_a_pod_there_is_no_witness(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert LeaseWitness.in_cluster("r", account=tmp_path) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert LeaseWitness.in_cluster("r", account=tmp_path) is None  # no token mounted
