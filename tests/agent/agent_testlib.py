"""Helpers of the agent tests (imported by conftest.py and the test modules): start real
agents (real torch, gloo, several processes), wait for conditions with deadlines, and
never leave a process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from netlib import free_port
from proclib import wait_for

SCRIPTS = Path(__file__).resolve().parent / "scripts"
WORKER = str(SCRIPTS / "worker.py")
TRAIN = str(SCRIPTS / "train.py")
STORE = str(SCRIPTS / "store.py")
#: A gloo all-reduce loop: "<time> <world size> <rank>" per step into $SILENT_LOG, forever.
SILENT_TRAIN = str(SCRIPTS.parents[2] / "bench" / "scripts" / "silent_train.py")


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without anything that would steer the agent."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHSTEP_", "PET_", "TORCHELASTIC_")) and k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    if os.environ.get("TORCHSTEP_TEST_ZYGOTE") == "0":  # the whole suite on the exec path (no zygote)
        env["TORCHSTEP_ZYGOTE"] = "0"
    env.update(extra or {})
    return env


def alive(pid: int) -> bool:
    """``True`` if /proc says ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Agent:
    """One ``python -m torchstep.agent`` process started by a test."""

    def __init__(self, out: Path, argv: list[str], env: dict[str, str]) -> None:
        self.out = out
        self.log_dir = out / "logs"
        self.result_file = out / "result.json"
        self.pids_dir = out / "pids"
        self.pids_dir.mkdir(parents=True)
        env = {**env, "PIDS_DIR": str(self.pids_dir)}
        self._stdout = open(out / "stdout", "w")
        self._stderr = open(out / "stderr", "w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self._stdout, stderr=self._stderr, env=env, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    @property
    def stdout(self) -> str:
        return (self.out / "stdout").read_text()

    @property
    def stderr(self) -> str:
        return (self.out / "stderr").read_text()

    @property
    def result(self) -> dict[str, Any]:
        return json.loads(self.result_file.read_text())

    def worker_pids(self, tag: str = "") -> list[int]:
        return sorted(int(p.name.split(".")[1]) for p in self.pids_dir.iterdir() if p.name.startswith(tag))

    def wait(self, timeout: float = 120) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"agent did not finish within {timeout}s\n{self.diagnostics()}") from None
        self._stdout.close()
        self._stderr.close()
        return code

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        # workers live in their own sessions; the reaper kills them, but be sure
        for pid in self.worker_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def diagnostics(self) -> str:
        text = f"--- stdout (tail)\n{self.stdout[-4000:]}\n--- stderr (tail)\n{self.stderr[-6000:]}"
        if self.result_file.exists():
            text += f"\n--- result\n{self.result_file.read_text()[-4000:]}"
        return text


class Agents:
    """Start agents in a test; everything is killed at the end of the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.started: list[Agent] = []

    def start(
        self, args: list[str], *, env: dict[str, str] | None = None, name: str | None = None, files: bool = True
    ) -> Agent:
        out = self.tmp_path / (name or f"agent{len(self.started)}")
        argv = [sys.executable, "-m", "torchstep.agent"]
        if files:
            argv += ["--log-dir", str(out / "logs"), "--result-file", str(out / "result.json")]
        agent = Agent(out, [*argv, *args], clean_env(env))
        self.started.append(agent)
        return agent

    def start_command(self, argv: list[str], *, env: dict[str, str] | None = None, name: str) -> Agent:
        """Start any command (e.g. ``bash -c "torchrun ..."``); its agent writes its result and
        logs where ``TORCHSTEP_RESULT_FILE`` / ``TORCHSTEP_LOG_DIR`` say (set here)."""
        out = self.tmp_path / name
        files = {"TORCHSTEP_RESULT_FILE": str(out / "result.json"), "TORCHSTEP_LOG_DIR": str(out / "logs")}
        agent = Agent(out, argv, {**clean_env(env), **files})
        self.started.append(agent)
        return agent

    def run(self, args: list[str], *, timeout: float = 120, **kw: Any) -> Agent:
        agent = self.start(args, **kw)
        agent.wait(timeout)
        return agent

    def cleanup(self) -> None:
        for agent in self.started:
            if agent.proc.poll() is None:
                agent.kill()
            for pid in agent.worker_pids():
                if alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


class StoreHost:
    """A process that hosts the c10d rendezvous store, as the local supervisor does."""

    def __init__(self, tmp_path: Path) -> None:
        port_file = tmp_path / "store.port"
        self.proc = subprocess.Popen([sys.executable, STORE, str(port_file)], env=clean_env(), start_new_session=True)
        self.port = int(wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 60, "the store"))
        self.endpoint = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def train_steps(path: Path) -> list[tuple[float, int]]:
    """(time, world size) of each all-reduce a node's workers logged (bench/scripts/silent_train.py)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((float(parts[0]), int(parts[1])))
    return out


def node_args(endpoint: str, i: int, conf: str) -> list[str]:
    """An agent of the elastic ``1:3`` run of :func:`start_three_nodes`: node ``i`` on
    127.0.0.``i+1``, hosting the store when ``i`` is 0."""
    return [
        "--nnodes",
        "1:3",
        "--nproc-per-node",
        "1",
        "--max-restarts",
        "3",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "takeover",
        "--local-addr",
        f"127.0.0.{i + 1}",  # a host each (the loopback range): the new store is on another address
        "--rdzv-conf",
        f"{conf},last_call_timeout=2,is_host={'true' if i == 0 else 'false'}",
        SILENT_TRAIN,
    ]


def start_three_nodes(
    agents: Agents, tmp_path: Path, conf: str
) -> tuple[list[Agent], list[Path], Callable[[int], list[str]]]:
    """Three agents of one elastic ``1:3`` c10d run on loopback, each on an address of its own
    (127.0.0.1-3), the first hosting the store; returned once all three train together, with
    the command line of node ``i`` (to start a replacement)."""
    endpoint = f"127.0.0.1:{free_port()}"
    nodes_conf = f"{conf},store_candidates=127.0.0.2|127.0.0.3" if "store_takeover=on" in conf else conf
    nodes, logs = [], []
    for i in range(3):
        log = tmp_path / f"steps{i}.log"
        args = node_args(endpoint, i, nodes_conf)
        nodes.append(agents.start(args, name=f"node{i}", env={"SILENT_LOG": str(log)}))
        logs.append(log)
        if i == 0:  # the store's host first, so that the others find it
            time.sleep(1.0)
    wait_for(
        lambda: all(any(w == 3 for _, w in train_steps(p)) for p in logs) or any_ended(nodes),
        240,
        "the three nodes to train together",
    )
    assert not any_ended(nodes), "\n\n".join(n.diagnostics() for n in nodes)
    return nodes, logs, lambda i: node_args(endpoint, i, nodes_conf)


def any_ended(nodes: list[Agent]) -> bool:
    return any(n.proc.poll() is not None for n in nodes)
