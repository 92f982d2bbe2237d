"""Helpers of the torch matrix: run the real agent (``python -m torchstep.agent``) and
torchrun with a row's interpreter, torchstep from this checkout's source tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

from agent_testlib import Agent, Agents, clean_env
from proclib import wait_for

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
AGENT_SCRIPTS = HERE.parent / "agent" / "scripts"
PROBE = str(SCRIPTS / "probe.py")
WORKER = str(AGENT_SCRIPTS / "worker.py")  # the agent suite's worker (crash, timer, linger modes)
TRAIN = str(AGENT_SCRIPTS / "train.py")  # its elastic training loop
STORE = str(AGENT_SCRIPTS / "store.py")
ENVDUMP = str(AGENT_SCRIPTS / "envdump.py")


class RowPython:
    """A row's interpreter and the environment its agents run in."""

    def __init__(self, row: Any, python: str, root: Path) -> None:
        self.row = row
        self.python = python
        # TORCHSTEP_MATRIX_SRC: another tree's adapters/core/src (e.g. a commit before a fix)
        self.src = os.environ.get("TORCHSTEP_MATRIX_SRC") or str(root / "adapters" / "core" / "src")

    def env(self, extra: dict[str, str] | None = None, *paths: str) -> dict[str, str]:
        """The test's environment for this row: nothing that steers the agent, torchstep
        from the source tree (and ``paths``) first on the path, then ``extra``."""
        env = clean_env()
        env.pop("TORCHSTEP_ZYGOTE", None)  # each test here says which path it runs
        env.pop("VIRTUAL_ENV", None)
        env["PYTHONPATH"] = os.pathsep.join([self.src, *paths])
        env.update(extra or {})
        return env


class MatrixAgents(Agents):
    """:class:`agent_testlib.Agents` with the row's interpreter."""

    def __init__(self, tmp_path: Path, row: RowPython) -> None:
        super().__init__(tmp_path)
        self.row = row

    def start(
        self, args: list[str], *, env: dict[str, str] | None = None, name: str | None = None, files: bool = True
    ) -> Agent:
        out = self.tmp_path / (name or f"agent{len(self.started)}")
        argv = [self.row.python, "-m", "torchstep.agent"]
        if files:
            argv += ["--log-dir", str(out / "logs"), "--result-file", str(out / "result.json")]
        agent = Agent(out, [*argv, *args], self.row.env(env))
        self.started.append(agent)
        return agent

    def launch(self, launcher: str, args: list[str], out: Path, timeout: float = 180) -> subprocess.CompletedProcess:
        """Run ``torchstep.agent`` or ``torch.distributed.run`` (torchrun) of the row to its end."""
        module = "torchstep.agent" if launcher == "agent" else "torch.distributed.run"
        out.mkdir(parents=True, exist_ok=True)
        return subprocess.run(
            [self.row.python, "-m", module, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.row.env({}, str(AGENT_SCRIPTS)),
        )


class RowStore:
    """A process of the row hosting the c10d rendezvous store (as the local supervisor does)."""

    def __init__(self, tmp_path: Path, row: RowPython) -> None:
        port_file = tmp_path / "store.port"
        self.proc = subprocess.Popen([row.python, STORE, str(port_file)], env=row.env(), start_new_session=True)
        self.port = int(wait_for(lambda: port_file.exists() and port_file.read_text().strip(), 120, "the store"))
        self.endpoint = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def probes(a: Agent) -> list[dict[str, Any]]:
    """What each rank of a probe.py run said about itself, by rank."""
    found = [json.loads(p.read_text()) for p in a.out.glob("probe/rank*.json")]
    return sorted(found, key=lambda d: d["rank"])


def no_traceback(a: Agent) -> None:
    """The agent said nothing with a Python traceback (a clean run, or torch's table only)."""
    assert "Traceback" not in a.stderr, a.diagnostics()


__all__ = ["ENVDUMP", "PROBE", "TRAIN", "WORKER", "MatrixAgents", "RowPython", "RowStore", "no_traceback", "probes"]
