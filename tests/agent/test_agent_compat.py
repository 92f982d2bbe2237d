"""The agent on the user's torch (issue 32): every torch private name goes through
``torchstep.agent.compat``; a torch outside the supported range is refused in one line with
a FAILED result; the worker zygote forks workers on CUDA builds (PyPI's default wheels),
with or without a GPU. These run in the torch matrix against each (Python, torch)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from agent_testlib import Agents, clean_env

AGENT_DIR = Path(__file__).resolve().parents[2] / "adapters/core/src/torchstep/agent"
WORKER_API = AGENT_DIR.parent / "worker.py"


# -- one module for torch's private names -----------------------------------------------------------------
def _torch_private_names() -> set[str]:
    """Every ``_name`` torch's elastic agent, launcher, accelerator modules and ``torch._C``
    stubs define or use (read from the installed torch's sources, not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent
    files = [*(root / "distributed").rglob("*.py"), root / "_utils_internal.py", root / "__init__.py"]
    for sub in ("cuda", "xpu", "mtia", "accelerator", "multiprocessing", "numa"):
        files += (root / sub).rglob("*.py")
    files += (root / "_C").glob("*.pyi")
    names: set[str] = set()
    for path in files:
        names.update(re.findall(r"\b(_[A-Za-z]\w*)", path.read_text(errors="replace")))
    return {n for n in names if not (n.startswith("__") and n.endswith("__"))}


def _agent_private_names() -> set[str]:
    """The private attributes and methods of torch's agent classes (``self._x`` in
    ``torch/distributed/elastic/agent/server``): a subclass naming one uses or clobbers it."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    server = Path(spec.origin).parent / "distributed/elastic/agent/server"
    names: set[str] = set()
    for path in server.glob("*.py"):
        text = path.read_text(errors="replace")
        names.update(re.findall(r"\bself\.(_[A-Za-z]\w*)", text))
        names.update(re.findall(r"^\s+def (_[A-Za-z]\w*)", text, re.M))
    return {n for n in names if not n.endswith("__")}


def _private_uses(path: Path, torch_names: set[str]) -> list[str]:
    """Where ``path`` names a torch private name: imports of ``_x`` from torch, ``x._y`` where
    ``_y`` is torch's (except on a non-torch module, or on ``self`` of a class of torchstep's
    own), ``self._y`` of a class extending torch's agent where ``_y`` is the agent's, and
    ``getattr(x, "_y")``."""
    agent_names = _agent_private_names()
    tree = ast.parse(path.read_text())
    modules: dict[str, str] = {}  # a local name bound to an imported module -> that module
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                modules[(alias.asname or alias.name).split(".")[0]] = alias.name
                if alias.name.startswith("torch.") and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"{path.name}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            for alias in node.names:
                if alias.name.startswith("_") or any(p.startswith("_") for p in (node.module or "").split(".")):
                    found.append(f"{path.name}:{node.lineno} from {node.module} import {alias.name}")

    from_torch = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch"
        for alias in node.names
    }

    def own_class(cls: ast.ClassDef) -> bool:  # a class of torchstep's alone: its self._x are its own
        def torchy(base: ast.expr) -> bool:
            text = ast.unparse(base)
            return "compat" in text or text.startswith("torch.") or text.split(".")[0] in from_torch

        return not any(torchy(b) for b in cls.bases)

    def visit(node: ast.AST, self_is_own: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, own_class(child))
                continue
            if isinstance(child, ast.FunctionDef) and not self_is_own and child.name in agent_names:
                found.append(f"{path.name}:{child.lineno} def {child.name} (overrides torch's)")
            if isinstance(child, ast.Attribute) and child.attr in torch_names:
                base = child.value
                name = base.id if isinstance(base, ast.Name) else None
                on_module = name in modules and not modules[name].startswith("torch")
                on_self = name in ("self", "cls")
                if on_self and not self_is_own:  # a subclass of torch's agent: its own names are fine
                    clash = child.attr in agent_names
                else:
                    clash = not (on_module or on_self)
                if clash:
                    found.append(f"{path.name}:{child.lineno} {ast.unparse(child)}")
            if (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id in ("getattr", "hasattr", "setattr")
                and len(child.args) > 1
                and isinstance(child.args[1], ast.Constant)
                and child.args[1].value in torch_names
            ):
                found.append(f"{path.name}:{child.lineno} {ast.unparse(child)}")
            visit(child, self_is_own)

    visit(tree, True)
    return found


def test_no_agent_module_but_compat_names_a_torch_private_name() -> None:
    """A private name that moves in some torch must break in one module, where each use says
    which versions it was checked on (docs/agent.md, "Supported torch and Python")."""
    torch_names = _torch_private_names()
    assert {"_rendezvous", "_shutdown", "_pcontext", "_is_in_bad_fork", "_get_addr_and_port"} <= torch_names
    modules = [p for p in sorted(AGENT_DIR.glob("*.py")) if p.name != "compat.py"] + [WORKER_API]
    found = [use for path in modules for use in _private_uses(path, torch_names)]
    assert not found, "torch private names outside agent/compat.py:\n" + "\n".join(found)
    # ... and the check sees one where there is one
    assert _private_uses(AGENT_DIR / "compat.py", torch_names)


# -- the supported range ----------------------------------------------------------------------------------
def _fake_torch(tmp_path: Path, version: str) -> str:
    """A directory that, first on ``PYTHONPATH``, makes the metadata say torch ``version``."""
    site = tmp_path / f"torch-{version}"
    info = site / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    return str(site)


def _with_path(site: str) -> dict[str, str]:
    """The environment with ``site`` first on ``PYTHONPATH``."""
    import os

    return {"PYTHONPATH": os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)}


@pytest.mark.parametrize("version", ["2.3.1+cu121", "1.13.1"])
def test_a_torch_older_than_supported_is_refused_in_one_line_with_a_failed_result(
    agents: Agents, tmp_path: Path, version: str
) -> None:
    a = agents.run(
        ["--nproc-per-node", "2", str(tmp_path / "never_run.py")],
        env={**_with_path(_fake_torch(tmp_path, version)), "TORCHSTEP_ZYGOTE": "1"},
        timeout=120,
    )
    assert a.returncode == 2, a.diagnostics()
    lines = [line for line in a.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, a.stderr
    assert f"torch {version} is installed" in lines[0] and "torch 2.4 or newer" in lines[0], lines[0]
    assert "pip install 'torch>=2.4'" in lines[0]
    assert "Traceback" not in a.stderr + a.stdout
    result = a.result
    assert (result["state"], result["exit_code"]) == ("FAILED", 2)
    assert f"torch {version} is installed" in result["message"]
    assert not a.log_dir.exists()  # refused before anything was set up


def test_a_refusal_also_writes_the_launchers_result_file(tmp_path: Path) -> None:
    """Under a launcher the result file comes from ``TORCHSTEP_RESULT_FILE`` (no flag)."""
    target = tmp_path / "launcher" / "result.json"
    target.parent.mkdir()
    env = clean_env({**_with_path(_fake_torch(tmp_path, "2.2.0")), "TORCHSTEP_RESULT_FILE": str(target)})
    done = subprocess.run(
        [sys.executable, "-m", "torchstep.agent", "t.py"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert json.loads(target.read_text())["state"] == "FAILED"


def test_a_torch_newer_than_checked_runs_and_the_settings_line_says_so(agents: Agents, tmp_path: Path) -> None:
    """Newer releases are not refused (every private name is detected, not assumed): the
    settings line names the version."""
    script = tmp_path / "ok.py"
    script.write_text("print('ran', flush=True)\n")
    a = agents.run(["--nproc-per-node", "1", str(script)], env=_with_path(_fake_torch(tmp_path, "2.99.0")))
    assert a.returncode == 0, a.diagnostics()
    line = next(line for line in a.stderr.splitlines() if "effective settings" in line)
    assert "torch 2.99.0 is newer than the newest checked (2.15)" in line


def test_the_range_words() -> None:
    from torchstep.agent import compat

    assert compat.torch_refusal("2.4.0") == "" and compat.torch_refusal("2.15.0+cu130") == ""
    assert compat.torch_refusal("2.16.0a0+git1234") == ""
    assert compat.torch_refusal(None).startswith("torch is not installed; torchstep-agent needs torch 2.4")
    assert compat.newer_than_checked("2.15.0") == "" and compat.newer_than_checked("2.4.1") == ""


# -- torch's behaviour where a feature is missing --------------------------------------------------------
def test_every_torchrun_flag_of_this_torch_parses_and_one_it_lacks_is_refused_as_torchrun_refuses_it(
    tmp_path: Path,
) -> None:
    """The agent's parser is this torch's torchrun parser: a flag of a newer torchrun is
    refused by both with the same message and exit status."""
    from torch.distributed.run import get_args_parser

    flags = {opt for action in get_args_parser()._actions for opt in action.option_strings}
    newer = next(
        (
            f
            for f in ("--shutdown-timeout", "--signals-to-handle", "--numa-binding", "--print-completion")
            if f not in flags
        ),
        None,
    )
    if newer is None:
        pytest.skip("this torch's torchrun has every flag the agent knows of")
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    argv = [newer, "1", str(script)]
    ours = subprocess.run(
        [sys.executable, "-m", "torchstep.agent", *argv], env=clean_env(), capture_output=True, text=True, timeout=120
    )
    theirs = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *argv],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ours.returncode == theirs.returncode == 2
    assert f"unrecognized arguments: {newer}" in ours.stderr and f"unrecognized arguments: {newer}" in theirs.stderr


def test_resolving_the_settings_never_asks_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch >= 2.8's LaunchConfig asks ``is_available()`` / ``device_count()`` for default
    NUMA options; on a CUDA build that registers torch's fork handler, and every worker the
    zygote forks later is a "bad fork" (issue 32). The agent's settings never ask."""
    import torch
    from torchstep.agent.settings import resolve

    def asked(*_: object, **__: object) -> bool:
        raise AssertionError("the accelerator was asked")

    for module in (torch.cuda, getattr(torch, "accelerator", None)):
        if module is not None:
            monkeypatch.setattr(module, "is_available", asked)
            monkeypatch.setattr(module, "device_count", asked)
    settings = resolve(["--nproc-per-node", "2", "t.py"], environ={})
    assert settings.config.nproc_per_node == 2 and settings.config.numa_options is None


# -- the zygote on CUDA builds ----------------------------------------------------------------------------
CUDA_PROBE = r"""
import os, sys
preloaded = "torch" in sys.modules
import torch
bad = torch.cuda._is_in_bad_fork()
print(f"rank {os.environ['RANK']} preloaded={preloaded} bad_fork={bad} cuda_build={torch.version.cuda is not None}",
      flush=True)
open(os.path.join(os.environ["PIDS_DIR"], f"parent{os.environ['RANK']}.{os.getppid()}"), "w").close()
if torch.cuda.is_available():  # a GPU machine: the forked worker initialises CUDA itself
    x = torch.ones(2, device=f"cuda:{int(os.environ['LOCAL_RANK']) % torch.cuda.device_count()}")
    print(f"rank {os.environ['RANK']} cuda ok {float(x.sum())}", flush=True)
"""


def test_workers_are_forked_from_the_zygote_on_a_cuda_build(agents: Agents, tmp_path: Path) -> None:
    """PyPI's default torch is a CUDA build: the zygote forks every worker there, with or
    without a GPU, and a forked worker may use CUDA (torch does not see a bad fork)."""
    script = tmp_path / "cuda_probe.py"
    script.write_text(CUDA_PROBE)
    a = agents.run(["--nproc-per-node", "2", str(script)], env={"TORCHSTEP_ZYGOTE": "1"}, timeout=180)
    assert a.returncode == 0, a.diagnostics()
    assert "worker zygote not used" not in a.stderr + a.stdout, a.diagnostics()
    for rank in (0, 1):
        assert f"rank {rank} preloaded=True bad_fork=False" in a.stdout, a.diagnostics()
    parents = {int(p.name.split(".")[1]) for p in a.pids_dir.glob("parent*")}
    assert len(parents) == 1 and a.pid not in parents, parents  # one zygote forked both


EMBED = r"""
import sys, torch
torch.cuda.is_available()  # an embedding program probed CUDA before running the agent
from torchstep.agent.cli import run
sys.exit(run(sys.argv[1:]))
"""


def test_an_agent_that_probed_cuda_still_forks_usable_workers(tmp_path: Path) -> None:
    """An agent that asked CUDA before the zygote was forked (an embedding program, or
    ``--nproc-per-node gpu``) would hand the zygote a bad fork: the zygote becomes a fresh
    interpreter instead, and the workers it forks are good."""
    (tmp_path / "pids").mkdir()
    script = tmp_path / "cuda_probe.py"
    script.write_text(CUDA_PROBE)
    embed = tmp_path / "embed.py"
    embed.write_text(EMBED)
    env = clean_env({"PIDS_DIR": str(tmp_path / "pids"), "TORCHSTEP_ZYGOTE": "1"})
    done = subprocess.run(
        [sys.executable, str(embed), "--log-dir", str(tmp_path / "logs"), "--nproc-per-node", "2", str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "worker zygote not used" not in done.stderr + done.stdout, done.stderr
    for rank in (0, 1):
        assert f"rank {rank} preloaded=True bad_fork=False" in done.stdout, done.stdout + done.stderr


# -- what a rendezvous costs --------------------------------------------------------------------------------
QUICKEN = """
import json, sys
import torch.distributed.elastic.rendezvous.dynamic_rendezvous as dr
import torch.distributed.elastic.rendezvous.utils as utils
from torchstep.agent import compat

slept = []
utils.time.sleep = slept.append  # what torch's _delay would wait, without waiting


class Handler:  # torch names an event after the caller of its _record
    def next_rendezvous(self):
        return self._record()

    def _record(self):
        return dr.get_method_name()


before = Handler().next_rendezvous()
replaced = compat.quicken_rendezvous(single_node=sys.argv[1] == "1")
after = Handler().next_rendezvous()
shallow = compat._method_name(depth=10_000)
dr._delay(seconds=(0.5, 0.5))  # the first round's skew, as next_rendezvous calls it
dr._delay(seconds=1)  # a round waiting for nodes
print(json.dumps({"replaced": replaced, "before": before, "after": after, "shallow": shallow, "slept": slept}))
"""


@pytest.mark.parametrize("single_node", [True, False], ids=["one node", "several nodes"])
def test_a_one_node_rendezvous_skips_the_skew_between_nodes_and_names_events_alike(
    tmp_path: Path, single_node: bool
) -> None:
    """torch waits a random 0-0.3 s before a node's first round, to skew many nodes' joins,
    and names each event with ``inspect.stack()``: a one-node run (every ``--nnodes 1``
    step) skips the wait, its fixed waits stay, several nodes keep torch's skew, and events
    keep torch's names (checked against torch's own function before the change)."""
    script = tmp_path / "quicken.py"
    script.write_text(QUICKEN)
    done = subprocess.run(
        [sys.executable, str(script), "1" if single_node else "0"],
        env=clean_env({}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == seen["after"] == "next_rendezvous", seen
    assert seen["shallow"] == "no_method_name"
    if single_node:
        assert seen["replaced"] == ["get_method_name", "_delay"]
        assert seen["slept"] == [1], seen  # the skew skipped, the fixed wait kept
    else:
        assert seen["replaced"] == ["get_method_name"]
        assert seen["slept"] == [0.5, 1], seen
