"""The stacks of workers the agent exec'd (not forked from the zygote) whose script never
imports torchstep (issue 37 §1): the exec wrapper's ``sitecustomize`` gives a Python worker
the stack handler without changing what the program sees (``PYTHONPATH``, ``sys.path``, the
image's own ``sitecustomize``); a shell script or a ``python -S`` worker gets a line saying
why it has no stack.

Real agents and workers (no torch in the workers: they start in a fraction of a second), and
real processes for the wrapper's environment; timings never asserted."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from agent_testlib import Agents, clean_env
from proclib import wait_for
from torchstep.agent import _exec, stacks
from torchstep.contract import STACKS_SIGNAL

#: A plain script: no torchstep, no torch. It reports what it sees of its environment, then
#: is stuck in stuck_here() until the agent stops it.
PLAIN = """
import json, os, sys, time

def stuck_here(ready):
    tmp = os.path.join(os.path.dirname(ready), "tmp." + os.environ["RANK"])  # never matches ready.*
    with open(tmp, "w") as f:
        json.dump({
            "pythonpath": os.environ.get("PYTHONPATH"),
            "sys_path": sys.path,
            "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
            "torchstep": "torchstep" in sys.modules,
            "leftover": sorted(k for k in os.environ if k.startswith("TORCHSTEP_SITE")),
        }, f)
    os.replace(tmp, ready)
    time.sleep(600)

stuck_here(os.path.join(sys.argv[1], "ready." + os.environ["RANK"]))
"""


def start_plain(agents: Agents, tmp_path: Path, env: dict[str, str], nproc: int = 2):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    ready = tmp_path / "ready"
    ready.mkdir()
    agent = agents.start(
        ["--standalone", "--nproc-per-node", str(nproc), str(script), str(ready)],
        env={"TORCHSTEP_ZYGOTE": "0", **env},
    )
    seen = wait_for(
        lambda: (
            (len(list(ready.glob("ready.*"))) == nproc or agent.returncode is not None)
            and [json.loads(p.read_text()) for p in sorted(ready.glob("ready.*"))]
        ),
        120,
        "the ranks in stuck_here",
    )
    assert agent.returncode is None, agent.diagnostics()
    return agent, seen


def cancel(agent) -> dict:
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 143, agent.diagnostics()
    res = agent.result
    assert res["state"] == "CANCELLED"
    return res


def test_an_execd_plain_script_gives_its_stack_and_sees_its_own_environment(agents: Agents, tmp_path: Path) -> None:
    """Without PYTHONPATH and without torchstep in the script: each rank's stack is in the
    result's where-line and in stacks.txt, and the program saw no trace of the handler."""
    agent, seen = start_plain(agents, tmp_path, {})
    for s in seen:
        assert s["pythonpath"] is None and s["leftover"] == [] and not s["torchstep"], s
        assert _exec.SITE_DIR not in s["sys_path"], s
        # the one trace: with no sitecustomize of the image's, the import system keeps ours
        assert s["sitecustomize"] == os.path.join(_exec.SITE_DIR, "sitecustomize.py"), s
    res = cancel(agent)
    assert re.search(r"ranks 0, 1 at plain\.py:\d+ in stuck_here", res["message"]), res["message"]
    ranks = {r["rank"]: r for r in res["replicas"][0]["ranks"]}
    for r in (0, 1):
        assert ranks[r]["stack"][0].endswith("in stuck_here"), ranks[r]
        assert ranks[r]["stack"][0].split(":")[0].endswith("plain.py"), ranks[r]
    text = Path(res["replicas"][0]["stacks_file"]).read_text()
    assert text.count("in stuck_here") >= 2 and "the agent received SIGTERM" in text


def test_the_images_own_sitecustomize_still_runs_and_pythonpath_is_kept(agents: Agents, tmp_path: Path) -> None:
    """A PYTHONPATH entry of the user's holding a sitecustomize: it runs in every rank as
    before (same module, same file), PYTHONPATH reads as the user set it, and the ranks still
    give their stacks."""
    mine = tmp_path / "image_site"
    mine.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    (mine / "sitecustomize.py").write_text(
        "import os\n"
        "with open(os.path.join(os.environ['MY_MARKS'], 'ran.' + os.environ.get('RANK', 'x')), 'w') as f:\n"
        "    f.write(__name__)\n"
    )
    user_path = f"{mine}{os.pathsep}{tmp_path / 'elsewhere'}"
    agent, seen = start_plain(agents, tmp_path, {"PYTHONPATH": user_path, "MY_MARKS": str(marks)})
    # every rank ran it (so did the agent, ran.x: the same PYTHONPATH)
    assert {"ran.0", "ran.1"} <= {p.name for p in marks.iterdir()}
    assert {(marks / n).read_text() for n in ("ran.0", "ran.1")} == {"sitecustomize"}
    for s in seen:
        assert s["pythonpath"] == user_path and s["leftover"] == [], s
        assert s["sitecustomize"] == str(mine / "sitecustomize.py"), s
        assert str(mine) in s["sys_path"] and _exec.SITE_DIR not in s["sys_path"], s
    res = cancel(agent)
    assert re.search(r"ranks 0, 1 at plain\.py:\d+ in stuck_here", res["message"]), res["message"]


def test_a_shell_script_worker_gets_a_no_python_stack_line(agents: Agents, tmp_path: Path) -> None:
    """A non-Python entrypoint (``--no-python`` and a shell script): the rank says it is not
    a Python process; nothing was signalled (the script is still alive until the stop)."""
    ready = tmp_path / "ready"
    ready.mkdir()
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/sh\ntouch "$1/ready.$RANK"\nsleep 600\n')
    script.chmod(0o755)
    agent = agents.start(["--standalone", "--nproc-per-node", "1", "--no-python", str(script), str(ready)])
    wait_for(lambda: (ready / "ready.0").exists() or agent.returncode is not None, 120, "the script running")
    assert agent.returncode is None, agent.diagnostics()
    res = cancel(agent)
    (rank,) = res["replicas"][0]["ranks"]
    assert rank["stack"] == ["no stack: no Python stack: the worker is not a Python process (sh run.sh)"], rank
    assert "rank 0 gave no stack: no Python stack" in res["message"]


# -- the wrapper's environment and the agent's reasons, on real processes ----------------------
def test_site_env_is_given_only_to_a_python_that_reads_it(tmp_path: Path) -> None:
    env = {"TORCHSTEP_STACKS_FILE": str(tmp_path / "stacks.0"), "PATH": os.environ["PATH"]}
    got = _exec.site_env([sys.executable, "-u", "train.py"], env)
    assert got == {"PYTHONPATH": _exec.SITE_DIR, _exec.ORIGINAL_PYTHONPATH: "unset"}
    with_path = _exec.site_env([sys.executable, "train.py"], {**env, "PYTHONPATH": "/a:/b"})
    assert with_path["PYTHONPATH"] == f"{_exec.SITE_DIR}:/a:/b" and with_path[_exec.ORIGINAL_PYTHONPATH] == "set:/a:/b"
    for flags in (["-I"], ["-S"], ["-E"], ["-W", "ignore", "-uS"]):
        assert _exec.site_env([sys.executable, *flags, "train.py"], env) == {}, flags
    shebang = tmp_path / "train.py"
    shebang.write_text(f"#!{sys.executable}\nprint(1)\n")
    assert _exec.site_env([str(shebang)], env)["PYTHONPATH"] == _exec.SITE_DIR
    shell = tmp_path / "run.sh"
    shell.write_text("#!/bin/sh\necho hi\n")
    assert _exec.site_env([str(shell)], env) == {} and _exec.site_env(["sh", str(shell)], env) == {}
    assert _exec.site_env([sys.executable, "train.py"], {"PATH": os.environ["PATH"]}) == {}  # no stacks file


def test_the_wrappers_sitecustomize_installs_the_handler_and_chains(tmp_path: Path) -> None:
    """The environment site_env gives, on a real interpreter: the handler answers the agent's
    signal with all threads; the user's sitecustomize ran; a subprocess gets neither."""
    mine = tmp_path / "image_site"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("import os\nos.environ['IMAGE_SITE_RAN'] = __file__\n")
    path = tmp_path / "stacks.0"
    code = (
        "import os, subprocess, sys, time\n"
        "child = subprocess.run([sys.executable, '-c', 'import os,sys; print(os.environ.get(\"PYTHONPATH\"), "
        '"sitecustomize" in sys.modules and sys.modules["sitecustomize"].__file__)\'], capture_output=True, text=True)\n'
        "def spin_here():\n"
        "    print(os.environ['IMAGE_SITE_RAN'], child.stdout.strip(), flush=True)\n"
        "    time.sleep(120)\n"
        "spin_here()\n"
    )
    env = clean_env({"TORCHSTEP_STACKS_FILE": str(path), "PYTHONPATH": str(mine)})
    env.update(_exec.site_env([sys.executable, "-c", code], env))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        image_site, child_path, child_site = proc.stdout.readline().split()
        assert image_site == str(mine / "sitecustomize.py")
        assert (child_path, child_site) == (str(mine), str(mine / "sitecustomize.py"))  # no trace in children
        assert path.read_text().startswith(f"torchstep stacks of pid {proc.pid}\n")
        found = stacks.collect([stacks.StackTarget(0, proc.pid, str(path))])
        assert found[0].ok and found[0].where.endswith("in spin_here"), found[0]
        assert STACKS_SIGNAL == signal.SIGRTMIN + 6  # the sitecustomize's own copy of the number
    finally:
        proc.kill()
        proc.wait()


def test_the_reasons_for_no_stack_name_the_process(tmp_path: Path) -> None:
    isolated = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(120)"])
    shell = subprocess.Popen(["sh", "-c", "sleep 120; true"])
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        for p in (isolated, shell, plain):  # the kernel sets a new program's arguments a moment after exec
            wait_for(lambda p=p: Path(f"/proc/{p.pid}/cmdline").read_bytes(), 30, "the command line")
        assert stacks.no_handler_reason(isolated.pid).startswith("no stack handler: the worker runs with -S")
        assert stacks.no_handler_reason(shell.pid) == "no Python stack: the worker is not a Python process (sh -c)"
        assert stacks.no_handler_reason(plain.pid).startswith("no stack handler (none installed yet")
    finally:
        for p in (isolated, shell, plain):
            p.kill()
            p.wait()
