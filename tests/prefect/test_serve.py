"""``flow.serve(cron=...)`` against a real Prefect server (``prefect server start`` on a
loopback port, its own PREFECT_HOME and SQLite): the deployment exists with its schedule, a
run triggered through the API completes, and a long run cancelled through the API ends
Cancelled with no process of the step left (agents, workers, children, daemons). Ctrl-C of
a flow run in a terminal stops every process of its step. One server serves the module."""

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from netlib import api_call, free_port
from prefectlib import start_server, stop_server
from proclib import procs_with_env, wait_for

httpx = pytest.importorskip("httpx")
pytest.importorskip("prefect")

HERE = Path(__file__).resolve().parent


def state_of(api: str, run_id: str) -> str:
    return api_call("GET", f"{api}/flow_runs/{run_id}").json()["state"]["type"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """``prefect server start`` on a free loopback port with its own PREFECT_HOME and SQLite,
    once for the module (its start is most of a test's cost): its API URL, and the
    environment its clients start from (without PREFECT_API_URL)."""
    home = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(home / "home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "XDG_STATE_HOME": str(home / "state"),
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
            "PYTHONPATH": os.pathsep.join(sys.path),
        }
    )
    proc = start_server(env, port, home / "server.log")
    try:
        yield api, env
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_a_served_flow_runs_from_the_api_and_a_cancelled_run_leaves_no_process(
    server: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    api, env = server
    env = {**env, "XDG_STATE_HOME": str(tmp_path / "state")}
    procs = []
    logs = []
    try:
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(HERE / "served_flow.py"), "0 2 * * *"],
                env={**env, "PREFECT_API_URL": api},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

        def deployment() -> dict | None:
            r = httpx.get(f"{api}/deployments/name/nightly/nightly", timeout=5)
            return r.json() if r.status_code == 200 else None

        dep = wait_for(deployment, 120, "the served deployment", interval=0.5)
        assert [s["schedule"]["cron"] for s in dep["schedules"]] == ["0 2 * * *"]

        def run(mark: str, seconds: float) -> str:
            r = api_call(
                "POST",
                f"{api}/deployments/{dep['id']}/create_flow_run",
                json={"parameters": {"mark": mark, "seconds": seconds}},
            )
            r.raise_for_status()
            return r.json()["id"]

        done = run(f"serve-ok-{uuid.uuid4().hex[:6]}", 0.5)
        wait_for(lambda: state_of(api, done) in ("COMPLETED", "FAILED", "CRASHED"), 240, "the first run", interval=1)
        assert state_of(api, done) == "COMPLETED", (tmp_path / "serve.log").read_text()[-3000:]

        mark = f"serve-cancel-{uuid.uuid4().hex[:6]}"
        long = run(mark, 600)
        wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 6, 240, "the long run's processes")
        r = api_call(
            "POST",
            f"{api}/flow_runs/{long}/set_state",
            json={"state": {"type": "CANCELLING", "name": "Cancelling"}, "force": True},
        )
        r.raise_for_status()
        t0 = time.monotonic()
        wait_for(lambda: state_of(api, long) in ("CANCELLED", "FAILED", "CRASHED", "COMPLETED"), 120, "the cancel")
        assert state_of(api, long) == "CANCELLED"
        wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "no process of the cancelled step")
        task_runs = api_call("POST", f"{api}/task_runs/filter", json={"flow_runs": {"id": {"any_": [long]}}})
        assert [t["state"]["type"] for t in task_runs.json()] == ["CANCELLED"]  # not Crashed
        assert time.monotonic() - t0 < 60

        # Ctrl-C of the served flow: the runner stops, and so does every process of its run
        mark = f"serve-ctrl-c-{uuid.uuid4().hex[:6]}"
        last = run(mark, 600)
        wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 6, 240, "the last run's processes")
        os.killpg(procs[0].pid, signal.SIGINT)
        procs[0].wait(timeout=90)
        wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "no process after Ctrl-C")
        assert state_of(api, last) in ("CRASHED", "CANCELLED")  # Prefect 3.7's runner marks it Crashed
    finally:
        for p in reversed(procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in reversed(procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for log in logs:
            log.close()


def test_ctrl_c_of_a_flow_in_a_terminal_stops_every_process_of_the_step(
    server: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """KeyboardInterrupt in the flow's process: the step stops everything before it exits
    (the flow reports to the module's server, not to a temporary one of its own)."""
    api, server_env = server
    mark = f"ctrl-c-{uuid.uuid4().hex[:6]}"
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\n"
        "from prefect import flow\n"
        "from torchstep_prefect import app_task\n"
        f"sleeper = app_task({str(HERE.parent / 'apps' / 'steps.py') + ':sleeper'!r}, defaults={{'mark': ''}})\n"
        "@flow\n"
        "def run(mark: str) -> None:\n"
        "    sleeper(mark=mark, seconds=600, replicas=2)\n"
        "run(sys.argv[1])\n"
    )
    env = {**server_env, "PREFECT_API_URL": api, "XDG_STATE_HOME": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, str(script), mark],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(procs_with_env(f"TORCHSTEP_TEST_MARK={mark}")) >= 6, 240, "the step's processes")
        os.kill(proc.pid, signal.SIGINT)
        proc.wait(timeout=90)
        wait_for(lambda: not procs_with_env(f"TORCHSTEP_TEST_MARK={mark}"), 30, "no process after Ctrl-C")
        assert proc.returncode != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
