"""Install each distribution's built wheel, not editable, into its own fresh virtual
environment with the newest versions its dependency ranges allow, and use it there as a
user would: from a directory outside the repository, with nothing of the repository on
``sys.path``.

Per environment (run ``make dist`` first: the wheels come from ``dist/``):

- a probe checks that the packages are imported from the environment's site-packages,
  that the distributions are not editable installs, that their version is the one written in
  their pyproject.toml, that the package data is there (``py.typed``, the ``torchrun`` shim
  and its mode), that the console scripts and entry points load, and that importing the
  package pulled in no torch;
- the distribution's own unit tests (``adapters/<dist>/tests``) run against the installed
  package (``--import-mode=importlib``: the test files are read, the repository is not put
  on ``sys.path``; a plugin checks it at the session's start);
- that adapter's example runs end to end from a copy of ``dags/`` and ``components/`` (the
  user's project): ``torchx run -s torchstep_local utils.echo``; the Airflow example DAG with
  ``dag.test()``; the KFP example pipeline compiled and run with ``kfp.local``; the Prefect
  example flow run.

``core-nightly`` checks the core against torchx-nightly (a different distribution of the
same ``torchx`` package, so never in one venv with torchx): pinned to one daily build, so a
new nightly cannot turn CI red by itself; bump it on purpose.

torch (the examples' steps run the agent) is installed from the file pip would pick, the way
the Makefile installs it: pip's own configuration may point at a local CPU build, which uv
does not read. Usage: ``python tools/test_wheels.py [core core-nightly airflow kfp prefect]``
(``TORCHSTEP_WHEELS_JOBS``: environments at once, default 2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from torch_matrix import RowSkipped, find_python, in_ci  # tools/ is sys.path[0]

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
UV = Path(sys.executable).parent / "uv"
TOOLS = ["pytest", "pytest-timeout", "hypothesis"]
TORCH = "torch==2.13.0"  # as the Makefile installs it
TORCHX_NIGHTLY = "torchx-nightly==2026.10.26"
EXAMPLE_TIMEOUT = 900
# the user's uv cache, though each check has its own HOME: installs link from it
UV_CACHE = subprocess.run([str(UV), "cache", "dir"], check=True, capture_output=True, text=True).stdout.strip()


def version_of(dist_dir: str) -> str:
    return tomllib.loads((ROOT / "adapters" / dist_dir / "pyproject.toml").read_text())["project"]["version"]


@dataclass
class Env:
    name: str
    dists: list[str]  # adapters/<dir> whose wheels are installed
    module: str  # the package the user imports
    report: list[str]  # distributions whose versions the summary shows
    torch: bool = True
    tests: list[str] = field(default_factory=list)  # test paths, relative to the repository
    python: str = ""  # ``3.X``: that interpreter (tools/torch_matrix.py finds it); "": this one


ENVS = {
    "core": Env("core", ["core"], "torchstep", ["torchx", "torch"], tests=["adapters/core/tests"]),
    "core-nightly": Env(
        "core-nightly",
        ["core"],
        "torchstep",
        ["torchx-nightly"],
        torch=False,
        tests=["adapters/core/tests/test_torchx_versions.py"],
    ),
    # the oldest Python of requires-python: the wheel installs there (tomli included), imports
    # without torch, and the unit tests of what differs on 3.10 (the states, the result, the
    # annotations TorchX reads, every public docstring's example) pass; the whole suite runs in
    # "core" (the agent on 3.10 with a real torch: tests/torchmatrix)
    "core-py310": Env(
        "core-py310",
        ["core"],
        "torchstep",
        ["torchx", "tomli"],
        torch=False,
        python="3.10",
        tests=[
            f"adapters/core/tests/test_{t}.py"
            for t in ("states_and_errors", "result_rules", "result_summary", "materialize_annotations", "docstrings")
        ],
    ),
    "airflow": Env(
        "airflow",
        ["core", "airflow"],
        "torchstep_airflow",
        ["apache-airflow", "apache-airflow-task-sdk"],
        tests=["adapters/airflow/tests"],
    ),
    "kfp": Env("kfp", ["core", "kfp"], "torchstep_kfp", ["kfp"], tests=["adapters/kfp/tests"]),
    "prefect": Env("prefect", ["core", "prefect"], "torchstep_prefect", ["prefect"], tests=["adapters/prefect/tests"]),
}

DIST_NAMES = {
    "core": "torchstep",
    "airflow": "torchstep-airflow",
    "kfp": "torchstep-kfp",
    "prefect": "torchstep-prefect",
}
MODULES = {"core": "torchstep", "airflow": "torchstep_airflow", "kfp": "torchstep_kfp", "prefect": "torchstep_prefect"}

# Runs inside each environment, from a directory outside the repository.
PROBE = r"""
import importlib, importlib.metadata as md, json, os, stat, sys, sysconfig
root, module, dists = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
site = os.path.realpath(sysconfig.get_paths()["purelib"])
bad = [p for p in sys.path if p and os.path.realpath(p).startswith(root + os.sep)]
assert not bad, f"the repository is on sys.path: {bad}"
mod = importlib.import_module(module)
assert "torch" not in sys.modules, f"importing {module} pulled in torch"
for dist, (pkg, version) in dists.items():
    where = os.path.realpath(importlib.import_module(pkg).__file__)
    assert where.startswith(site + os.sep), f"{pkg} imported from {where}, not from {site}"
    d = md.distribution(dist)
    direct = d.read_text("direct_url.json")
    assert not (direct and json.loads(direct).get("dir_info", {}).get("editable")), f"{dist} is an editable install"
    assert d.version == version, f"{dist} {d.version}, pyproject.toml says {version}"
    assert getattr(importlib.import_module(pkg), "__version__") == version, f"{pkg}.__version__"
    assert os.path.isfile(os.path.join(os.path.dirname(where), "py.typed")), f"{pkg}: no py.typed"
    for ep in d.entry_points:
        ep.load()  # every entry point (console scripts, torchx.schedulers, airflow provider) imports
    assert "torch" not in sys.modules, f"an entry point of {dist} pulled in torch"
if "torchstep" in dists:
    from torchstep.agent import shims_dir
    shim = os.path.join(shims_dir(), "torchrun")
    assert os.path.realpath(shim).startswith(site + os.sep) and os.stat(shim).st_mode & stat.S_IXUSR, shim
print("probe ok:", module, "from", os.path.dirname(mod.__file__))
"""

# A pytest plugin (-p): the packages under test come from the environment, never the repository.
PLUGIN = r"""
import importlib, os, sys, sysconfig

def pytest_sessionstart(session):
    root = os.environ["TORCHSTEP_REPO_ROOT"]
    site = os.path.realpath(sysconfig.get_paths()["purelib"])
    bad = [p for p in sys.path if p and os.path.realpath(p).startswith(root + os.sep)]
    assert not bad, f"the repository is on sys.path: {bad}"
    for pkg in os.environ["TORCHSTEP_WHEEL_PACKAGES"].split(","):
        where = os.path.realpath(importlib.import_module(pkg).__file__)
        assert where.startswith(site + os.sep), f"{pkg} imported from {where}"
"""

AIRFLOW_DRIVER = r"""
import json, os, sys
sys.path.append(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])  # as Airflow does for its dags bundle
import importlib.util
spec = importlib.util.spec_from_file_location("torchstep_example", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
dr = module.dag.test(run_conf={"steps": 5})
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session
with create_session() as session:
    states = {ti.task_id: str(ti.state) for ti in dr.get_task_instances(session=session)}
    row = session.query(XComModel).filter_by(dag_id=dr.dag_id, run_id=dr.run_id, task_id="train",
                                             key="return_value").one_or_none()
    train = XComModel.deserialize_value(row) if row is not None else {}
print("AIRFLOW_RESULT " + json.dumps({"state": str(dr.state), "tasks": states, "train": train.get("state")}))
"""

PREFECT_DRIVER = r"""
import sys
sys.path.insert(0, "dags/prefect")
from train_flow import train_flow
print("PREFECT_RESULT", train_flow(base_lr=0.05, steps=5, replicas=1))
"""

KFP_COMPILE = r"""
import sys
sys.path.insert(0, "dags/kfp")
from kfp import compiler
from train_pipeline import train_pipeline
compiler.Compiler().compile(train_pipeline, "train_pipeline.yaml")
print("compiled")
"""


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def torch_requirement() -> str:
    """The torch file pip would install here (pip's configuration may name a local CPU
    build), as a direct reference uv installs and caches; a plain pin where pip finds none."""
    out = run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--no-deps",
            "--report",
            "-",
            TORCH,
        ]
    )
    try:
        (item,) = json.loads(out.stdout)["install"]
        return f"torch @ {item['download_info']['url']}"
    except (ValueError, KeyError):
        return TORCH


def wheel(dist_dir: str) -> str:
    name = DIST_NAMES[dist_dir].replace("-", "_")
    found = sorted(DIST.glob(f"{name}-{version_of(dist_dir)}-*.whl"))
    if not found:
        raise SystemExit(f"no wheel of {DIST_NAMES[dist_dir]} {version_of(dist_dir)} in dist/: run `make dist` first")
    return str(found[-1])


def clean_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "PREFECT_", "VIRTUAL_ENV", "PYTHON", "KFP", "TORCHX", "TORCHSTEP"))
    }
    env.update(
        {
            "HOME": str(home),
            "XDG_STATE_HOME": str(home / "state"),
            "TMPDIR": str(home),
            "PYTHONDONTWRITEBYTECODE": "1",
            "UV_CACHE_DIR": UV_CACHE,
        }
    )
    return env


class Check:
    def __init__(self, env: Env, torch_req: str) -> None:
        self.env, self.torch_req = env, torch_req
        self.venv = Path()  # in the check's temporary directory, outside the repository
        self.py = ""
        self.log: list[str] = []
        self.times: dict[str, float] = {}

    def step(
        self,
        what: str,
        argv: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        timeout: float = 600,
        expect: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        try:
            out = run(argv, cwd=cwd, env=env, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise Failed(f"{what}: timed out after {timeout:.0f} s\n{e.stdout or ''}{e.stderr or ''}") from None
        self.times[what] = time.monotonic() - t0
        if out.returncode or (expect is not None and expect not in out.stdout + out.stderr):
            raise Failed(
                f"{what}: exit {out.returncode}, expected {expect!r}\n{out.stdout[-6000:]}{out.stderr[-6000:]}"
            )
        return out

    def install(self, home: Path) -> None:
        env = clean_env(home)
        self.venv = home / "venv"
        self.py = str(self.venv / "bin" / "python")
        python = sys.executable
        if self.env.python:
            try:
                python = find_python(self.env.python)
            except RowSkipped as e:  # under CI a missing interpreter fails, as in the torch matrix
                raise (Failed if in_ci() else Skipped)(str(e)) from None
        self.step("venv", [str(UV), "venv", "-q", "--python", python, str(self.venv)], cwd=home, env=env)
        # copies, not hardlinks into uv's cache: environments checked in parallel would share
        # inodes, and one's cleanup changes the ctime of the files of another's (the plan
        # store keys a builtin component by its file's ctime: a hit became a miss)
        install = [
            str(UV),
            "pip",
            "install",
            "-q",
            "--python",
            self.py,
            "--resolution",
            "highest",
            "--link-mode",
            "copy",
        ]
        wheels = [wheel(d) for d in self.env.dists]
        if self.env.name == "core-nightly":  # core's own dependency names torchx (the release)
            self.step("install", [*install, TORCHX_NIGHTLY, "pyyaml", *TOOLS], cwd=home, env=env)
            self.step("install core", [*install, "--no-deps", *wheels], cwd=home, env=env)
        else:
            torch = [self.torch_req] if self.env.torch else []
            self.step("install", [*install, *wheels, *torch, *TOOLS], cwd=home, env=env)

    def probe(self, home: Path) -> None:
        dists = {DIST_NAMES[d]: (MODULES[d], version_of(d)) for d in self.env.dists}
        argv = [self.py, "-c", PROBE, str(ROOT), self.env.module, json.dumps(dists)]
        self.step("probe", argv, cwd=home, env=clean_env(home), expect="probe ok")
        if self.env.torch:  # the console scripts of the installed wheel
            bin_ = self.venv / "bin"
            want = f" {version_of('core')}\n"
            self.step(
                "torchstep --version",
                [str(bin_ / "torchstep"), "--version"],
                cwd=home,
                env=clean_env(home),
                expect="torchstep" + want,
            )
            self.step(
                "torchstep-agent --version",
                [str(bin_ / "torchstep-agent"), "--version"],
                cwd=home,
                env=clean_env(home),
                expect="torchstep-agent" + want,
            )

    def unit_tests(self, home: Path) -> None:
        (home / "wheel_plugin.py").write_text(PLUGIN)
        (home / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider --import-mode=importlib\n")
        env = clean_env(home)
        env.update(
            {
                "TORCHSTEP_REPO_ROOT": str(ROOT),
                "PYTHONPATH": str(home),
                "TORCHSTEP_WHEEL_PACKAGES": ",".join(MODULES[d] for d in self.env.dists),
            }
        )
        tests = [str(ROOT / t) for t in self.env.tests]
        out = self.step(
            "unit tests",
            [
                self.py,
                "-m",
                "pytest",
                "-q",
                "-c",
                str(home / "pytest.ini"),
                "--rootdir",
                str(home),
                "-p",
                "wheel_plugin",
                *tests,
            ],
            cwd=home,
            env=env,
            timeout=900,
        )
        self.log.append(out.stdout.strip().splitlines()[-1])

    def example(self, home: Path) -> None:
        project = home / "project"  # the user's own files: the examples and their components
        for d in ("dags", "components"):
            shutil.copytree(ROOT / d, project / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        env = clean_env(home)
        bin_ = self.venv / "bin"
        env["PATH"] = f"{bin_}:{env['PATH']}"  # as in an activated environment
        name = self.env.name
        if name == "core":
            out = self.step(
                "example: torchx run -s torchstep_local utils.echo",
                [
                    str(bin_ / "torchx"),
                    "run",
                    "--wait",
                    "--log",
                    "-s",
                    "torchstep_local",
                    "utils.echo",
                    "--msg",
                    "hello from a wheel",
                ],
                cwd=project,
                env=env,
                timeout=EXAMPLE_TIMEOUT,
                expect="hello from a wheel",
            )
            handle = next(w for w in out.stdout.split() if w.startswith("torchstep_local://"))
            self.step(
                "example: torchx status",
                [str(bin_ / "torchx"), "status", handle],
                cwd=project,
                env=env,
                expect="SUCCEEDED",
            )
            self.log.append(f"torchx run -s torchstep_local: {handle} SUCCEEDED")
        elif name == "airflow":
            env.update(
                {
                    "AIRFLOW_HOME": str(home / "airflow"),
                    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                    "AIRFLOW__CORE__DAGS_FOLDER": str(project / "dags" / "airflow"),
                }
            )
            self.step("example: airflow db migrate", [str(bin_ / "airflow"), "db", "migrate"], cwd=project, env=env)
            (home / "driver.py").write_text(AIRFLOW_DRIVER)
            out = self.step(
                "example: dag.test()",
                [self.py, str(home / "driver.py"), str(project / "dags" / "airflow" / "torchstep_example.py")],
                cwd=project,
                env=env,
                timeout=EXAMPLE_TIMEOUT,
                expect="AIRFLOW_RESULT ",
            )
            line = next(x for x in out.stdout.splitlines() if x.startswith("AIRFLOW_RESULT "))
            result = json.loads(line.removeprefix("AIRFLOW_RESULT "))
            if result["state"] != "success" or result["train"] != "SUCCEEDED":
                raise Failed(f"example DAG: {result}\n{out.stdout[-6000:]}{out.stderr[-6000:]}")
            self.log.append(f"airflow dag.test(): {result['tasks']}")
        elif name == "kfp":
            self.step("example: kfp compile", [self.py, "-c", KFP_COMPILE], cwd=project, env=env, expect="compiled")
            out = self.step(
                "example: kfp.local run",
                [self.py, "dags/kfp/run_local.py", "--steps", "5", "--pipeline-root", str(home / "kfp-root")],
                cwd=project,
                env=env,
                timeout=EXAMPLE_TIMEOUT,
                expect="pipeline output: ",
            )
            self.log.append(next(x for x in out.stdout.splitlines() if x.startswith("pipeline output: ")))
        elif name == "prefect":
            env.update(
                {
                    "PREFECT_HOME": str(home / "prefect"),
                    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
                }
            )
            out = self.step(
                "example: prefect flow",
                [self.py, "-c", PREFECT_DRIVER],
                cwd=project,
                env=env,
                timeout=EXAMPLE_TIMEOUT,
                expect="PREFECT_RESULT ",
            )
            self.log.append(next(x for x in out.stdout.splitlines() if x.startswith("PREFECT_RESULT ")))

    def versions(self) -> str:
        out = run([str(UV), "pip", "list", "--python", self.py, "--format", "freeze"]).stdout.splitlines()
        return ", ".join(v for v in out if v.split("==")[0].lower() in self.env.report)

    def __call__(self) -> tuple[bool, str]:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"torchstep-wheel-{self.env.name}-") as tmp:
            home = Path(tmp)
            try:
                self.install(home)
                self.probe(home)
                if self.env.tests:
                    self.unit_tests(home)
                if self.env.torch:  # the examples' steps run the agent
                    self.example(home)
                ok, detail = True, ""
            except Failed as e:
                ok, detail = False, str(e)
            except Skipped as e:
                ok, detail = True, f"skipped: {e}"
            versions = self.versions()
            t1 = time.monotonic()
        self.times["cleanup"] = time.monotonic() - t1
        spent = ", ".join(f"{k} {v:.0f} s" for k, v in self.times.items())
        head = f"[{self.env.name}] {versions} — {'ok' if ok else 'FAILED'} in {time.monotonic() - t0:.0f} s"
        return ok, "\n".join([head, f"  ({spent})", *(f"  {line}" for line in self.log), detail]).rstrip()


class Failed(Exception):
    pass


class Skipped(Exception):
    """An environment that cannot be made on this machine (its Python is missing)."""


def main() -> int:
    names = sys.argv[1:] or list(ENVS)
    unknown = [n for n in names if n not in ENVS]
    if unknown:
        print(f"unknown environment(s) {unknown}; choose from {list(ENVS)}")
        return 2
    for d in MODULES:
        wheel(d)  # fail early without wheels
    torch_req = torch_requirement()
    jobs = int(os.environ.get("TORCHSTEP_WHEELS_JOBS", "2"))
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda n: Check(ENVS[n], torch_req)(), names))
    for _, text in results:
        print(text, flush=True)
    failed = [n for n, (ok, _) in zip(names, results, strict=True) if not ok]
    took = time.monotonic() - t0
    if failed:
        print(f"wheel install check failed for: {', '.join(failed)} ({took:.0f} s)")
        return 1
    print(f"wheel install check: {len(names)} environments ok in {took:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
