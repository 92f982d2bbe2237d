"""Airflow test harness: one shared AIRFLOW_HOME per session for ``dag.test()`` runs (each
DAG run in its own subprocess, so Airflow's process-wide configuration never leaks between
tests or into other test packages), and a real deployment (PostgreSQL + api-server +
scheduler + dag-processor, LocalExecutor) for the slow end-to-end test.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from netlib import free_port
from proclib import kill_all, procs_with_env

# In-process Airflow (operators built by tests): a private home, set before anything imports it.
if "AIRFLOW_HOME" not in os.environ:
    _home = tempfile.mkdtemp(prefix="torchstep-airflow-inproc-")
    atexit.register(shutil.rmtree, _home, ignore_errors=True)
    os.environ["AIRFLOW_HOME"] = _home
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BIN = Path(sys.executable).parent
AIRFLOW = str(BIN / "airflow")
DAG_FILES = [*sorted((HERE / "dags").glob("*.py")), *sorted((ROOT / "dags" / "airflow").glob("*.py"))]
DRIVER = HERE / "dag_test_driver.py"


def airflow_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment every Airflow process of a test gets (Airflow 3.3: its own home, SQLite or PostgreSQL, no examples)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "TORCHSTEP_TEST_LOG_DIR": str(home / "torchstep-logs"),
            # steps that keep the default log dir write under the home, never the user's ~/.local/state
            "XDG_STATE_HOME": str(home / "state"),
            # the agent's console script and the repository's components
            "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
            "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH", "")] if p),
        }
    )
    env.update(extra)
    return env


@pytest.fixture(scope="session")
def env_of_home():
    """:func:`airflow_env` for a test's own home (a DagBag parse needs no database)."""
    return airflow_env


def make_home(prefix: str) -> Path:
    home = Path(tempfile.mkdtemp(prefix=prefix))
    (home / "dags").mkdir()
    for f in DAG_FILES:  # links: the DAG files find the repository through Path(__file__).resolve()
        (home / "dags" / f.name).symlink_to(f)
    return home


def run(argv: list[str], env: dict[str, str], timeout: float, **kw) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, **kw)
    if out.returncode:
        raise AssertionError(f"{argv[:3]} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}")
    return out


# -- migrated databases, built once per test session ------------------------------------------
def shared_dir(name: str) -> Path | None:
    """A directory all of this session's xdist workers share (tests/conftest.py names its
    root in TORCHSTEP_TESTS_SHARED_TMP), or None outside such a session."""
    root = os.environ.get("TORCHSTEP_TESTS_SHARED_TMP")
    return Path(root) / name if root else None


def built_once(name: str, build) -> Path | None:
    """``build(dir)`` run by the first worker that asks, under a lock, and its directory
    returned to every worker after it: ``airflow db migrate`` costs a minute of CPU on a
    loaded machine, copying its result a fraction of a second."""
    where = shared_dir(name)
    if where is None:
        return None
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (where / ".complete").exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            build(where)
            (where / ".complete").touch()
    return where


def _migrated_sqlite(where: Path) -> None:
    home = make_home("torchstep-airflow-template-")
    try:
        run([AIRFLOW, "db", "migrate"], airflow_env(home), timeout=240)
        shutil.copy2(home / "airflow.db", where / "airflow.db")
    finally:
        shutil.rmtree(home, ignore_errors=True)


# -- dag.test() ---------------------------------------------------------------------------------
class DagTester:
    """Runs DAGs with ``dag.test()`` in subprocesses sharing one migrated AIRFLOW_HOME."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = airflow_env(home)

    def run(self, dag_id: str, conf: dict | None = None, *, timeout: float = 240) -> dict:
        files = [f for f in (self.home / "dags").glob("*.py") if f'"{dag_id}"' in f.read_text()]
        assert files, f"no DAG file defines {dag_id!r}"
        argv = [sys.executable, str(DRIVER), str(files[0]), dag_id, json.dumps(conf or {})]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("DAG_TEST_SUMMARY ")]
        if proc.returncode or not lines:
            raise AssertionError(
                f"dag.test of {dag_id} broke ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
            )
        summary = json.loads(lines[-1].split(" ", 1)[1])
        summary["output"] = proc.stdout + proc.stderr
        return summary

    def run_many(self, dag_id: str, confs: list[dict], *, timeout: float = 600) -> list[dict]:
        """One ``dag.test()`` per conf, all in one process; each summary's ``output`` holds
        the lines of its own run."""
        files = [f for f in (self.home / "dags").glob("*.py") if f'"{dag_id}"' in f.read_text()]
        assert files, f"no DAG file defines {dag_id!r}"
        argv = [sys.executable, str(DRIVER), str(files[0]), dag_id, json.dumps(confs)]
        # one stream, in the order it was written: each run's task log lines follow its mark
        proc = subprocess.run(
            argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout
        )
        runs = proc.stdout.split("DAG_TEST_BEGIN ")[1:]
        summaries = []
        for text in runs:
            marks = [x for x in text.splitlines() if x.startswith("DAG_TEST_SUMMARY ")]
            if not marks:
                break
            summary = json.loads(marks[-1].split(" ", 1)[1])
            summary["output"] = text
            summaries.append(summary)
        if proc.returncode or len(summaries) != len(confs):
            raise AssertionError(f"dag.test of {dag_id} broke ({proc.returncode}):\n{proc.stdout[-8000:]}")
        return summaries


@pytest.fixture(scope="session")
def dag_tester():
    home = make_home("torchstep-airflow-dagtest-")
    tester = DagTester(home)
    template = built_once("airflow-sqlite", _migrated_sqlite)
    if template is not None:
        shutil.copy2(template / "airflow.db", home / "airflow.db")
    else:
        run([AIRFLOW, "db", "migrate"], tester.env, timeout=180)
    yield tester
    kill_all(procs_with_env(f"AIRFLOW_HOME={home}"))
    shutil.rmtree(home, ignore_errors=True)


# -- a real deployment --------------------------------------------------------------------------
def postgres_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


class Postgres:
    """A throwaway PostgreSQL server on a loopback port, data in a temp dir."""

    def __init__(self, base: Path) -> None:
        pgbin = postgres_bin()
        assert pgbin is not None
        self.bin = pgbin
        self.dir = base / "pgdata"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            self.as_user = ["runuser", "-u", "postgres", "--"]
            base.chmod(0o755)
        self.dir.mkdir(mode=0o700)
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")

    def pg(self, tool: str, *args: str, timeout: float = 60) -> None:
        run([*self.as_user, str(self.bin / tool), *args], dict(os.environ), timeout=timeout)

    def start(self, template: Path | None = None) -> str:
        """Start the server: a fresh cluster with an empty ``airflow`` database, or a copy of
        ``template`` (a cluster stopped cleanly after ``airflow db migrate``)."""
        if template is None:
            self.pg("initdb", "-D", str(self.dir), "-A", "trust", "-U", "postgres", "--no-sync")
        else:  # as root: cp -a keeps the postgres owner and the 0700 modes
            run(["cp", "-a", f"{template}/.", str(self.dir)], dict(os.environ), timeout=120)
        opts = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off"
        self.pg("pg_ctl", "-D", str(self.dir), "-w", "-l", str(self.dir / "server.log"), "-o", opts, "start")
        if template is None:
            psql = ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "-v", "ON_ERROR_STOP=1"]
            self.pg(
                *psql, "-c", "CREATE USER airflow PASSWORD 'airflow'", "-c", "CREATE DATABASE airflow OWNER airflow"
            )
        return f"postgresql+psycopg2://airflow:airflow@127.0.0.1:{self.port}/airflow"

    def stop(self) -> None:
        if (self.dir / "postmaster.pid").exists():
            self.pg("pg_ctl", "-D", str(self.dir), "-m", "fast", "-w", "stop")


def _migrated_pgdata(where: Path) -> None:
    home = make_home("torchstep-airflow-pgtemplate-")
    pg = Postgres(home)
    try:
        conn = pg.start()
        run([AIRFLOW, "db", "migrate"], airflow_env(home, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=conn), timeout=300)
        pg.stop()
        run(["cp", "-a", str(pg.dir), str(where / "pgdata")], dict(os.environ), timeout=120)
    finally:
        with contextlib.suppress(AssertionError):
            pg.stop()
        shutil.rmtree(home, ignore_errors=True)


class Deployment:
    """api-server + scheduler + dag-processor with LocalExecutor on PostgreSQL."""

    COMPONENTS = {
        "api-server": ["api-server", "--host", "127.0.0.1", "--port", "{port}", "--workers", "1"],
        "scheduler": ["scheduler"],
        "dag-processor": ["dag-processor"],
    }

    def __init__(self) -> None:
        self.home = make_home("torchstep-airflow-deploy-")
        self.pg = Postgres(self.home)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.token = ""
        self.stopped: list[int] | None = None

    def start(self) -> None:
        built = built_once("airflow-postgres", _migrated_pgdata) if os.geteuid() == 0 else None
        template = built / "pgdata" if built is not None else None
        conn = self.pg.start(template)
        self.env = airflow_env(
            self.home,
            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=conn,
            AIRFLOW__CORE__EXECUTOR="LocalExecutor",
            AIRFLOW__CORE__PARALLELISM="4",
            AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
            AIRFLOW__API__HOST="127.0.0.1",
            AIRFLOW__API__PORT=str(self.port),
            AIRFLOW__API__BASE_URL=self.url,
            AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"{self.url}/execution/",
            AIRFLOW__API_AUTH__JWT_SECRET=secrets.token_hex(48),
            AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
            AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE="False",
        )
        if template is None:
            run([AIRFLOW, "db", "migrate"], self.env, timeout=240)
        for name, argv in self.COMPONENTS.items():
            log = open(self.home / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
            argv = [a.replace("{port}", str(self.port)) for a in argv]
            self.procs[name] = subprocess.Popen(
                [AIRFLOW, *argv], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
        self.wait(self.healthy, 120, "the api-server and scheduler to be healthy")
        self.token = self.call("GET", "/auth/token")["access_token"]
        # the first call is slow (~3 s; over 30 s under a load average of 18): warm it up, patiently
        self.wait(self.execution_api_answers, 180, "the execution API to answer")

    def execution_api_answers(self) -> bool:
        try:
            self.call("GET", "/execution/health")
        except OSError:  # a timeout: still warming up
            return False
        return True

    # -- REST -------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: dict | None = None, *, ok=(200, 201)) -> dict:
        req = urllib.request.Request(self.url + path, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        data = json.dumps(body).encode() if body is not None else None
        try:
            with urllib.request.urlopen(req, data=data, timeout=30) as resp:
                text = resp.read().decode()
                return json.loads(text) if text else {}
        except urllib.error.HTTPError as e:
            if e.code in ok:
                return {}
            raise AssertionError(f"{method} {path} -> {e.code}: {e.read().decode()[:2000]}") from None

    def healthy(self) -> bool:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited {p.returncode}:\n{self.log_of(name)[-5000:]}")
        try:
            h = self.call("GET", "/api/v2/monitor/health")
        except (OSError, AssertionError):
            return False
        return all(h.get(c, {}).get("status") == "healthy" for c in ("metadatabase", "scheduler"))

    def wait(self, cond, timeout: float, what: str, interval: float = 0.5):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = cond()
            if value:
                return value
            time.sleep(interval)
        logs = "\n".join(f"--- {n}\n{self.log_of(n)[-3000:]}" for n in self.procs)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}\n{logs}")

    def log_of(self, name: str) -> str:
        f = self.home / f"{name}.log"
        return f.read_text(errors="replace") if f.exists() else ""

    def start_run(self, dag_id: str, conf: dict | None = None) -> dict:
        """Trigger a run through the REST API (once the dag-processor has registered the DAG)."""

        def dag_known() -> bool:
            try:
                return bool(self.call("GET", f"/api/v2/dags/{dag_id}", ok=()))
            except AssertionError:
                return False

        self.wait(dag_known, 120, f"the dag-processor to register {dag_id}")
        return self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}})

    def trigger(self, dag_id: str, conf: dict | None = None, timeout: float = 180) -> dict:
        """Trigger a run through the REST API and wait until it finishes; returns the run."""
        run_ = self.start_run(dag_id, conf)
        path = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_['dag_run_id'], safe='')}"

        def finished() -> dict | None:
            r = self.call("GET", path)
            return r if r["state"] in ("success", "failed") else None

        return self.wait(finished, timeout, f"run {run_['dag_run_id']} of {dag_id} to finish", interval=1)

    # -- shutdown ---------------------------------------------------------------------------
    def stop(self) -> list[int]:
        """SIGTERM every component, wait, then report (and kill) any process left behind.
        Idempotent: returns the processes found left behind by the first call."""
        if self.stopped is not None:
            return self.stopped
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        deadline = time.monotonic() + 15
        left = procs_with_env(f"AIRFLOW_HOME={self.home}")
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = procs_with_env(f"AIRFLOW_HOME={self.home}")
        kill_all(left)
        self.pg.stop()
        self.stopped = left
        return left


@pytest.fixture(scope="module")
def deployment():
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (make system-deps installs it)")
    d = Deployment()
    try:
        d.start()
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.home, ignore_errors=True)


@pytest.fixture(scope="module")
def torchx_deployment():
    """A real deployment whose dags folder also holds the generic DAG of ``torchx run -s
    airflow``, installed the documented way (``python -m torchstep_airflow.torchx_dag``)."""
    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed (make system-deps installs it)")
    d = Deployment()
    out = subprocess.run(
        [sys.executable, "-m", "torchstep_airflow.torchx_dag", str(d.home / "dags")], capture_output=True, text=True
    )
    assert out.returncode == 0 and "torchstep_torchx.py" in out.stdout, out.stderr
    try:
        d.start()
        d.wait(lambda: _dag_known(d, "torchstep_torchx"), 180, "the generic DAG to be registered")
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.home, ignore_errors=True)


def _dag_known(d: Deployment, dag_id: str) -> bool:
    try:
        return bool(d.call("GET", f"/api/v2/dags/{dag_id}", ok=()))
    except AssertionError:
        return False
