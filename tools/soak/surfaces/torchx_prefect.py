"""Surface ``torchx_prefect``: ``torchx run -s prefect tools/soak/component.py:soak`` against a
real ``prefect server`` with the generic flow served (``python -m torchstep_prefect.torchx_flow
serve``), both started once per campaign process. The step runs in the flow-run process the
served flow's runner starts (the process watching the step: ``sigkill_watcher`` SIGKILLs it),
is cancelled with ``torchx cancel`` (the flow run set Cancelling, the runner stops it) and its
final state is the flow run's, read from the Prefect API once it is final.

The served flow runs the step without the submitter's environment (``inherit_env=False``):
the ``SOAK_*`` variables travel in the AppDef (the component's ``--env``), so the agents and
workers carry ``SOAK_MARK`` but the flow-run process does not; it is checked apart (it must
be gone within 15 s too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from tools.soak import closing, component, faults, procs, runkit
from tools.soak.model import Observation, Run

NAME = "torchx_prefect"
#: The classes an orchestrator changes (the rest test the agent alone: local, torchx).
FAULTS = ("none", "exit", "nonretryable", "sigkill_agent", "sigkill_watcher", "cancel", "flood")
LINES, INTERVAL_S = 10, 0.15
#: Starts a server: the smoke runs all of this surface's runs in one test worker.
SERVER = True
BIN = Path(sys.executable).parent

#: Where Prefect's outcome differs from the local target's (faults.FAULTS).
EXPECT = {
    "sigkill_watcher": dataclasses.replace(
        faults.FAULTS["sigkill_watcher"][1],
        state="FAILED",
        exit_code=None,
        guarantee=(
            "the flow-run process is SIGKILLed: its runner marks the flow run Crashed (`torchx status`: "
            "FAILED), the agents and workers die with it, no process left"
        ),
    ),
    "cancel": dataclasses.replace(
        faults.FAULTS["cancel"][1],
        exit_code=None,
        guarantee=(
            "`torchx cancel`: the flow run is Cancelled by its runner, the step CANCELLED, nothing left running"
        ),
    ),
}


@dataclasses.dataclass
class _Server:
    """A Prefect server and the served generic flow, private to this process."""

    root: Path
    url: str
    runner: subprocess.Popen[bytes]
    procs: list[subprocess.Popen[bytes]]

    @property
    def state_root(self) -> Path:
        """Where the flow runs' steps write their logs (the runner's XDG_STATE_HOME)."""
        return self.root / "runner-state" / "torchstep"


_server: _Server | None = None


def _http(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"null")


def _wait(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
        except (OSError, ValueError, urllib.error.URLError):
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def _stop(server: _Server) -> None:
    for p in reversed(server.procs):
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in reversed(server.procs):
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    shutil.rmtree(server.root, ignore_errors=True)


def server() -> _Server:
    """The process's Prefect server and served flow (started on first use, stopped at exit)."""
    global _server
    if _server is not None:
        return _server
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
    from netlib import free_port

    root = Path(tempfile.mkdtemp(prefix="soak-prefect-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        {
            "PREFECT_HOME": str(root / "home"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{root / 'db'}",
            "XDG_STATE_HOME": str(root / "runner-state"),
            "PREFECT_RUNNER_POLL_FREQUENCY": "1",
        }
    )
    started: list[subprocess.Popen[bytes]] = []
    try:
        with open(root / "server.log", "wb") as log:
            started.append(
                subprocess.Popen(
                    [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        _wait(lambda: _http("GET", f"{url}/health"), 180, "the Prefect server")
        with open(root / "serve.log", "wb") as log:
            started.append(
                subprocess.Popen(
                    [sys.executable, "-m", "torchstep_prefect.torchx_flow", "serve"],
                    env={**env, "PREFECT_API_URL": url},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=root,
                    start_new_session=True,
                )
            )
        _wait(lambda: _http("GET", f"{url}/deployments/name/torchstep-torchx/torchx"), 120, "the served flow")
    except BaseException:
        _stop(_Server(root, url, started[-1], started))
        raise
    _server = _Server(root, url, started[-1], started)
    closing.on_close(_stop, _server)
    return _server


def _flow_run_process(runner: int, rank_pid: int) -> int:
    """The runner's child above ``rank_pid``: the flow-run process (0 if none)."""
    return faults.agent_of(rank_pid, runner)


def _state(srv: _Server, flow_run_id: str) -> str | None:
    return ((_http("GET", f"{srv.url}/flow_runs/{flow_run_id}") or {}).get("state") or {}).get("type")


def run(run: Run, seed: int, workdir: Path) -> Observation:
    """Submit the soak job with ``torchx run -s prefect`` under ``run``'s fault: see the surface protocol in tools/soak/campaign.py (``SURFACES``)."""
    del seed
    srv = server()
    workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    ckpt, progress, state_dir = (workdir / n for n in ("ckpt", "progress", "state"))
    for d in (ckpt, progress, state_dir):
        d.mkdir(mode=0o700)
    notes: list[str] = []
    token = uuid.uuid4().hex
    job_env = runkit.job_env(run, token, ckpt, progress, LINES, INTERVAL_S)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["XDG_STATE_HOME"] = str(state_dir)

    def torchx(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "torchx"), *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout
        )

    before = set(srv.state_root.glob("soak-*")) if srv.state_root.exists() else set()
    started = time.monotonic()
    sub = torchx(
        "run",
        "-s",
        "prefect",
        "-cfg",
        f"endpoint={srv.url}",
        f"{component.__file__}:soak",
        "--job",
        component.JOB,
        "--env",
        ",".join(f"{k}={v}" for k, v in job_env.items()),
    )
    handle = next((ln for ln in sub.stdout.splitlines() if ln.startswith("prefect://")), "")
    if not handle:
        notes.append(f"torchx run failed ({sub.returncode}): {sub.stderr[-800:]}")
        return Observation(
            rc=sub.returncode,
            duration_s=time.monotonic() - started,
            result=None,
            result_source="none",
            console=sub.stdout + sub.stderr,
            run_dir=None,
            leftovers=procs.leftovers(f"SOAK_MARK={token}"),
            notes=notes,
        )
    record = json.loads(next((state_dir / "torchstep" / "torchx" / "prefect").glob("*.json")).read_text())
    flow_run_id = record["flow_run_id"]
    watcher = 0

    def running() -> bool:
        nonlocal watcher
        if not watcher:
            seen = faults.progress_of(progress, run.rank)
            if seen:
                watcher = _flow_run_process(srv.runner.pid, seen[0])
        return _state(srv, flow_run_id) not in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

    injected, hung = True, False
    if not faults.FAULTS[run.fault][0] and run.fault != "none":
        # the flow-run process is known once a rank reported (inject_external waits for that too)
        _wait(lambda: faults.progress_of(progress, run.rank) or not running(), 180, "the first line")
        running()
        injected = faults.inject_external(
            run.fault,
            run.rank,
            run.moment,
            alive=running,
            watcher=watcher,
            progress=progress,
            log_dir=workdir / "no-log-disk",
            cancel=lambda: notes.append(f"torchx cancel: rc {torchx('cancel', handle).returncode}"),
        )
    limit = started + faults.timeout_of(run.fault) + faults.DEADLINE_MARGIN_S
    if run.fault == "cancel" and injected:
        limit = time.monotonic() + faults.GRACE_S + faults.CANCEL_MARGIN_S
    while running():
        if time.monotonic() > limit:
            hung = True
            notes.append(f"the flow run was still {_state(srv, flow_run_id)} at the deadline")
            if watcher:
                faults.kill(watcher, signal.SIGKILL)
            break
        time.sleep(0.5)
    # the flow run is final before its process has sent the last of its logs to the API (20 MiB
    # of a flood take it tens of seconds): the console is read once that process has ended
    while watcher and faults.parent_of(watcher) == srv.runner.pid and time.monotonic() < limit:
        time.sleep(0.2)
    duration = time.monotonic() - started
    kind = _state(srv, flow_run_id)
    state = {"COMPLETED": "SUCCEEDED", "FAILED": "FAILED", "CRASHED": "FAILED", "CANCELLED": "CANCELLED"}.get(
        kind or "", kind
    )
    status = torchx("status", handle).stdout
    if f"State: {state}" not in status:
        notes.append(f"torchx status disagrees with the flow run ({kind}): {status.strip()[-300:]}")
    new = sorted((set(srv.state_root.glob("soak-*")) - before) if srv.state_root.exists() else set())
    run_dir = new[0] if len(new) == 1 else None
    result, source = None, "none"
    if run_dir is not None and (run_dir / "result.json").exists():
        try:
            result, source = json.loads((run_dir / "result.json").read_text()), "result.json"
        except (OSError, ValueError) as e:
            notes.append(f"result.json unreadable: {e}")
    console = torchx("log", handle).stdout
    leftovers = procs.leftovers(f"SOAK_MARK={token}")
    if watcher:  # the flow-run process carries no mark: it must be gone as well
        deadline = time.monotonic() + 15
        while faults.parent_of(watcher) and time.monotonic() < deadline:
            time.sleep(0.1)
        if faults.parent_of(watcher) == srv.runner.pid:
            leftovers.append(f"{watcher}: the flow-run process")
    injected = runkit.settle_injected(run, ckpt, injected, notes)
    rc = int(result["exit_code"]) if result and result.get("exit_code") is not None else -1
    expect = EXPECT.get(run.fault) if injected else None
    if expect is not None and expect.exit_code is None and result is not None:
        rc = int(result.get("exit_code") or 0)
    return Observation(
        rc=rc,
        duration_s=duration,
        result=result,
        result_source=source,
        console=console,
        run_dir=run_dir,
        leftovers=leftovers,
        hung=hung,
        injected=injected,
        notes=notes,
        state=state,
        watcher_killed=run.fault == "sigkill_watcher" and injected,
        agent_killed=run.fault == "sigkill_agent" and injected,
        extra={"flow_run_id": flow_run_id, "prefect_state": kind},
    )
