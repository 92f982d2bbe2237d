"""Private state trusts nothing it did not create (issue 24, section 3): the TorchX
schedulers' records under a state root another local user can reach.

Tests run as root; "another user" is uid 65534 (``os.chown``). The victim is the test.
A record names an endpoint and the *name* of a credential variable; a planted one would
make ``torchx list`` / ``status`` send ``Authorization: Bearer <that variable>`` to the
attacker's endpoint. Here the endpoint is a listener on 127.0.0.1 that counts requests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from torchstep.files import UnsafePathError
from torchstep.schedulers import records

TORCHX = str(Path(sys.executable).with_name("torchx"))
OTHER = 65534  # "nobody": the other local user
APP_ID = "torchstep-torchx:planted-1"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")


class Listener:
    """An HTTP endpoint on 127.0.0.1 that records every request it gets (and answers 200)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []
        seen = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                seen.append(("GET", self.path, self.headers.get("Authorization")))
                body = b'{"state": "running", "dag_runs": [], "task_instances": []}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_PATCH = do_GET

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    ear = Listener()
    yield ear
    ear.close()


def plant(state_root: Path, url: str, *, owner: int | None = OTHER, mode: int = 0o600) -> Path:
    """What the other user leaves: ``<state_root>/torchx/airflow/<id>.json`` naming their
    endpoint and the victim's credential variable, every piece owned by them."""
    directory = state_root / "torchx" / "airflow"
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / f"{APP_ID}.json"
    record.write_text(
        json.dumps(
            {
                "endpoint": url,
                "dag_id": "torchstep-torchx",
                "dag_run_id": "planted-1",
                "api": {"token_env": "VICTIM_TOKEN"},
            }
        )
    )
    record.chmod(mode)
    if owner is not None:
        for p in (state_root, state_root / "torchx", directory, record):
            os.chown(p, owner, owner)
    return record


def shared_sticky(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: everyone may create entries in it
    return shared


def victim(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "VICTIM_TOKEN": "s3cr3t-victim-token", "AIRFLOW_API_TOKEN": "s3cr3t-victim-token", **env}
    full.pop("TORCHSTEP_AIRFLOW_ENDPOINT", None)
    return subprocess.run([TORCHX, *args], capture_output=True, text=True, env=full, timeout=120)


@needs_root
@pytest.mark.parametrize("via", ["XDG_STATE_HOME", "TMPDIR"])
@pytest.mark.parametrize("command", ["list", "status"])
def test_a_record_planted_under_a_shared_state_root_sends_nothing_and_says_why(
    tmp_path: Path, listener: Listener, via: str, command: str
) -> None:
    shared = shared_sticky(tmp_path)
    if via == "XDG_STATE_HOME":
        env = {"XDG_STATE_HOME": str(shared)}
        state_root = shared / "torchstep"
    else:  # a service whose HOME is /: the state root falls back to $TMPDIR/torchstep-<uid>
        env = {"XDG_STATE_HOME": "", "HOME": "/", "TMPDIR": str(shared)}
        state_root = shared / f"torchstep-{os.geteuid()}"
    plant(state_root, listener.url)
    args = ["list", "-s", "airflow"] if command == "list" else ["status", f"airflow://torchx/{APP_ID}"]
    out = victim(args, env)
    assert listener.requests == []  # nothing reached the planted endpoint, no token left the machine
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert str(state_root) in text and f"owned by uid {OTHER}" in text, text[-3000:]
    assert "s3cr3t" not in text


@needs_root
def test_a_planted_record_in_the_victims_own_directories_is_refused_by_its_owner(
    tmp_path: Path, listener: Listener
) -> None:
    """The directories are the victim's (0700) but a file in them is not: refused on fstat."""
    root = tmp_path / "torchstep"
    records.records_dir("airflow", root=root)  # the victim's own directories, 0700
    record = plant(root, listener.url, owner=None)
    os.chown(record, OTHER, OTHER)
    with pytest.raises(UnsafePathError) as err:
        records.load("airflow", APP_ID, root=root)
    assert err.value.path == str(record) and f"owned by uid {OTHER}" in str(err.value)
    out = victim(["list", "-s", "airflow"], {"XDG_STATE_HOME": str(tmp_path)})
    assert listener.requests == [] and f"owned by uid {OTHER}" in out.stdout + out.stderr


def test_a_record_with_another_mode_or_a_symlink_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "state"
    records.save("airflow", "mine-1", {"endpoint": "http://127.0.0.1:1"}, root=root)
    path = root / "torchx" / "airflow" / "mine-1.json"
    path.chmod(0o644)
    with pytest.raises(UnsafePathError, match="has mode 0644, not 0600"):
        records.load("airflow", "mine-1", root=root)
    path.chmod(0o600)
    assert records.load("airflow", "mine-1", root=root) == {"endpoint": "http://127.0.0.1:1"}
    (root / "torchx" / "airflow" / "link-1.json").symlink_to(path)
    with pytest.raises(UnsafePathError, match="symlink"):
        records.load("airflow", "link-1", root=root)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
@pytest.mark.parametrize("which", ["state root", "torchx", "backend"])
def test_a_state_directory_others_can_write_is_refused_on_every_use(tmp_path: Path, which: str, mode: int) -> None:
    root = tmp_path / "state"
    records.save("airflow", "mine-1", {"endpoint": "http://127.0.0.1:1"}, root=root)
    loose = {"state root": root, "torchx": root / "torchx", "backend": root / "torchx" / "airflow"}[which]
    loose.chmod(mode)
    for call in (
        lambda: records.load("airflow", "mine-1", root=root),
        lambda: records.app_ids("airflow", root=root),
        lambda: records.save("airflow", "mine-2", {}, root=root),
    ):
        with pytest.raises(UnsafePathError) as err:
            call()
        assert err.value.path == str(loose) and "writable by" in str(err.value)
        assert f"chmod go-w {loose}" in err.value.fix
    assert stat_mode(loose) == mode  # refused, not silently changed


def test_a_state_root_under_a_parent_anyone_can_replace_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "open"
    parent.mkdir()
    parent.chmod(0o777)  # not sticky: anyone could rename the state root and put theirs in its place
    with pytest.raises(UnsafePathError) as err:
        records.save("airflow", "mine-1", {"endpoint": "http://127.0.0.1:1"}, root=parent / "state")
    assert err.value.path == str(parent) and "not sticky" in str(err.value)
    assert not (parent / "state").exists()  # refused before anything was created under it


@pytest.mark.parametrize(
    "record, key",
    [
        ({"endpoint": "http://user:pw@127.0.0.1:1"}, "endpoint"),
        ({"endpoint": "file:///etc/passwd"}, "endpoint"),
        ({"endpoint": "http://127.0.0.1:1", "ui_endpoint": "http://x/?token=1"}, "ui_endpoint"),
        ({"endpoint": "http://127.0.0.1:1", "api": {"token_env": "GHP_0123456789ABCDEF"}}, None),
        ({"endpoint": "http://127.0.0.1:1", "api": {"token_env": "ghp_0123456789abcdef"}}, "token_env"),
        ({"endpoint": "http://127.0.0.1:1", "api": {"token_env": "A B"}}, "token_env"),
        ({"endpoint": "http://127.0.0.1:1", "api_key_env": 12}, "api_key_env"),
    ],
)
def test_endpoints_and_variable_names_in_a_record_are_checked_again_as_on_submit(
    tmp_path: Path, record: dict, key: str | None
) -> None:
    root = tmp_path / "state"
    records.save("airflow", "mine-1", record, root=root)
    if key is None:  # a variable name that looks like a token is still a name: the submit rule allows it
        assert records.load("airflow", "mine-1", root=root) == record
        return
    with pytest.raises(UnsafePathError) as err:
        records.load("airflow", "mine-1", root=root)
    assert f"{key!r}" in str(err.value) and "pw" not in str(err.value) and "token=1" not in str(err.value)


def stat_mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


@needs_root
@pytest.mark.parametrize("what", ["foreign", "symlink", "loose"])
def test_private_dir_checks_the_directories_that_already_exist(tmp_path: Path, what: str) -> None:
    from torchstep.files import private_dir

    base = tmp_path / "state"
    middle = base / "torchx"
    if what == "symlink":
        (tmp_path / "elsewhere").mkdir()
        base.mkdir()
        middle.symlink_to(tmp_path / "elsewhere")
    else:
        middle.mkdir(parents=True)
        if what == "foreign":
            os.chown(middle, OTHER, OTHER)
        else:
            middle.chmod(0o777)
    with pytest.raises(UnsafePathError) as err:
        private_dir(middle / "airflow", base=base)
    assert err.value.path == str(middle)
    assert {"foreign": f"owned by uid {OTHER}", "symlink": "symlink", "loose": "writable by"}[what] in str(err.value)
    assert not os.path.lexists(middle / "airflow") and not os.listdir(
        tmp_path / "elsewhere" if what == "symlink" else middle
    )


def test_every_schedulers_credential_option_is_checked_again_in_its_record() -> None:
    """A record is re-checked on the keys that name credential variables: each scheduler's
    option of that kind must be one of them (a new one missed here would be sent unchecked)."""
    import importlib

    from torchstep.schedulers.rules import CREDENTIAL_VARS

    tables = {}
    for module in ("torchstep.schedulers.airflow", "torchstep.schedulers.prefect", "torchstep_kfp.torchx_scheduler"):
        try:
            tables[module] = importlib.import_module(module).OPTIONS
        except ImportError:  # an adapter not installed (isolated installs)
            continue
    named = {
        key
        for table in tables.values()
        for key, (_, _, text) in table.items()
        if "NAME of the environment variable" in text
    }
    assert named and named <= CREDENTIAL_VARS


def test_a_record_whose_step_options_end_in_env_is_still_read(tmp_path: Path) -> None:
    """Only credential options are variable names: ``inherit_env`` (a bool the local
    scheduler stores) is not refused as one."""
    records.save("torchstep_local", "echo-1", {"cfg": {"inherit_env": False}, "token_env": "MY_TOKEN"}, root=tmp_path)
    assert records.load("torchstep_local", "echo-1", root=tmp_path)["cfg"] == {"inherit_env": False}
    records.save("airflow", "echo-2", {"endpoint": "http://127.0.0.1:1", "token_env": "ghp_abc"}, root=tmp_path)
    with pytest.raises(UnsafePathError, match="token_env"):
        records.load("airflow", "echo-2", root=tmp_path)
