"""Where every rank was when the agent stopped the group (issue 37 §1): the stacks taken
before a stop, their parse and summary, NCCL's flight recorder variables and dumps, and the
progress a worker reports.

The agent tests run real agents and real workers (gloo); the others run a real worker
process or parse real ``faulthandler`` dumps of this one."""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from agent_testlib import SCRIPTS, Agents, alive, clean_env
from proclib import wait_for
from torchstep.agent import hang, stacks
from torchstep.agent.stacks import RankStack, StackTarget
from torchstep.result import StepResult, progress_info, progress_line

HANG = str(SCRIPTS / "hang.py")


def ready_times(d: Path) -> list[float]:
    return [float(p.read_text()) for p in d.glob("ready.*")]


def start_loader(agents: Agents, tmp_path: Path, *extra: str, nproc: int = 3, mode: str = "loader", **kw):
    ready = tmp_path / "ready"
    ready.mkdir()
    agent = agents.start(
        [
            "--standalone",
            "--nproc-per-node",
            str(nproc),
            *extra,
            HANG,
            "--mode",
            mode,
            "--rank",
            str(nproc - 1),
            "--dir",
            str(ready),
        ],
        **kw,
    )
    return agent, ready


# -- the agent, end to end -------------------------------------------------------------------
def test_sigterm_takes_every_ranks_stack_and_names_the_outlier(agents: Agents, tmp_path: Path) -> None:
    """A cancel (an orchestrator's timeout is a SIGTERM to the agent) of a group where rank
    2 sleeps in its data loader while ranks 0 and 1 wait for it in all_reduce: the result
    says so, each rank carries its innermost frames, and the file has every thread."""
    agent, ready = start_loader(agents, tmp_path)
    wait_for(lambda: len(ready_times(ready)) == 3 or agent.returncode is not None, 120, "the ranks in place")
    assert agent.returncode is None, agent.diagnostics()
    time.sleep(0.3)  # ranks 0 and 1 are inside all_reduce by now
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 143, agent.diagnostics()
    res = agent.result
    assert res["state"] == "CANCELLED"
    assert re.search(r"rank 2 at hang\.py:\d+ in load_batch; ranks 0, 1 waiting in all_reduce", res["message"]), res
    ranks = {r["rank"]: r for r in res["replicas"][0]["ranks"]}
    assert ranks[2]["stack"][0].endswith("in load_batch") and ranks[2]["waiting_in"] is None
    for r in (0, 1):
        assert ranks[r]["waiting_in"] == "all_reduce"
        assert any("hang.py" in line and line.endswith("in main") for line in ranks[r]["stack"])
    path = res["replicas"][0]["stacks_file"]
    assert path and path.startswith(str(agent.log_dir)) and path.endswith("/attempt_0/stacks.txt")
    text = Path(path).read_text()
    assert "the agent received SIGTERM" in text and "load_batch" in text
    assert text.count("(most recent call first)") >= 3  # every rank's threads
    # the whole group's stacks within the bound (the agent's log line says how long they took)
    took = float(re.search(r"where the ranks were \(.*?; ([\d.]+)s\)", agent.stderr).group(1))  # type: ignore[union-attr]
    assert took <= stacks.COLLECT_TIMEOUT_S + 0.5, agent.stderr


def test_a_rank_blocking_the_signal_still_gets_a_line(agents: Agents, tmp_path: Path) -> None:
    """A rank with the stacks signal blocked cannot answer: it gets a line saying so, and
    the cancel goes on within the bound (the group is not kept waiting)."""
    agent, ready = start_loader(agents, tmp_path, nproc=2, mode="blocked")
    wait_for(lambda: len(ready_times(ready)) == 2 or agent.returncode is not None, 120, "the ranks in place")
    sent = time.monotonic()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(60) == 143, agent.diagnostics()
    assert time.monotonic() - sent < 30  # 2 s of stacks + the grace period, never the workers' 600 s sleep
    for r in agent.result["replicas"][0]["ranks"]:
        assert r["stack"] and r["stack"][0].startswith("no stack: no answer within 2s"), r
    assert "gave no stack: no answer within 2s" in agent.result["message"]


# -- collect, on a real process --------------------------------------------------------------
WORKER = """
import os, sys, time
import torchstep.worker as w
assert w.install_stack_dump()
assert w.install_stack_dump()  # idempotent
def spin_here():
    print("ready", flush=True)
    time.sleep(120)
spin_here()
"""


def test_collect_reads_a_real_workers_dump_and_never_signals_a_process_without_handler(tmp_path: Path) -> None:
    path = tmp_path / "stacks.0"
    env = clean_env({"TORCHSTEP_STACKS_FILE": str(path)})
    script = tmp_path / "w.py"
    script.write_text(WORKER)
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # no handler
    bare_file = tmp_path / "stacks.1"
    bare_file.write_text("")
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert path.read_text().startswith(f"torchstep stacks of pid {proc.pid}")
        assert path.stat().st_mode & 0o777 == 0o600
        found = stacks.collect([StackTarget(0, proc.pid, str(path)), StackTarget(1, bare.pid, str(bare_file))])
        assert found[0].ok and re.fullmatch(r"w\.py:\d+ in spin_here", found[0].where), found[0]
        assert [f.function for f in found[0].frames] == ["spin_here", "<module>"]
        assert found[0].frames[0].file == str(script)
        assert not found[1].ok and "no stack handler" in found[1].where
        assert alive(proc.pid) and alive(bare.pid)  # a stack costs nothing; no default action fired
        again = stacks.collect([StackTarget(0, proc.pid, str(path))])
        assert again[0].ok  # appended to the file: read from where it was
    finally:
        for p in (proc, bare):
            p.kill()
            p.wait()
    gone = stacks.collect([StackTarget(0, proc.pid, str(path))])
    assert not gone[0].ok and gone[0].where == "it had exited"


# -- parsing and summary ---------------------------------------------------------------------
def _dump_of_this_process(tmp_path: Path) -> str:
    """A real faulthandler dump (all threads) while a helper thread sleeps in ``snooze``."""
    stop = threading.Event()

    def snooze() -> None:
        stop.wait(30)

    t = threading.Thread(target=snooze)
    t.start()
    try:
        time.sleep(0.05)
        out = tmp_path / "dump.txt"
        with open(out, "w") as f:
            faulthandler.dump_traceback(f, all_threads=True)
        return out.read_text()
    finally:
        stop.set()
        t.join()


def test_parse_dump_picks_the_thread_with_the_script(tmp_path: Path) -> None:
    text = _dump_of_this_process(tmp_path)
    assert "in snooze" in text  # the helper thread is in the dump...
    frames, where, waiting = stacks.parse_dump(text)
    assert frames and all(f.function != "snooze" for f in frames)  # ... but the main thread is reported
    assert any(f.function == "_dump_of_this_process" for f in frames)
    assert where == f"test_stacks.py:{frames[0].line} in _dump_of_this_process" or "test_stacks.py" in where
    assert waiting is None


def test_parse_dump_names_the_collective_and_the_users_frame() -> None:
    torch_dir = "/venv/lib/python3.11/site-packages/torch/distributed"
    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"
        '  File "/usr/lib/python3.11/threading.py", line 320 in wait\n'
        '  File "/usr/lib/python3.11/threading.py", line 1000 in _bootstrap\n\n'
        "Current thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{torch_dir}/distributed_c10d.py", line 2501 in all_reduce\n'
        f'  File "{torch_dir}/c10d_logger.py", line 83 in wrapper\n'
        '  File "/src/train.py", line 42 in step\n'
        '  File "/src/train.py", line 90 in <module>\n'
    )
    frames, where, waiting = stacks.parse_dump(dump)
    assert (where, waiting) == ("train.py:42 in step", "all_reduce")
    assert str(frames[0]) == f"{torch_dir}/distributed_c10d.py:2501 in all_reduce"
    assert stacks.parse_dump("garbage\n") == ([], "no Python frame", None)


def test_summary_groups_ranks_and_puts_the_outliers_first() -> None:
    s = {r: RankStack(r, where="t.py:1 in f", waiting_in="all_reduce", ok=True) for r in (0, 1, 2, 5)}
    s[3] = RankStack(3, where="train.py:42 in load_batch", ok=True)
    s[4] = RankStack(4, where="no stack handler (started by exec, without the torchstep worker API)")
    line = stacks.summary(s)
    assert line == (
        "rank 3 at train.py:42 in load_batch; ranks 0-2, 5 waiting in all_reduce; "
        "rank 4 gave no stack: no stack handler (started by exec, without the torchstep worker API)"
    )
    assert stacks.outliers(s) == [3]
    everyone_waits = {r: RankStack(r, where="t.py:1 in f", waiting_in="barrier", ok=True) for r in range(2)}
    assert stacks.outliers(everyone_waits) == []  # the culprit is elsewhere (another node)
    assert stacks.summary(everyone_waits) == "ranks 0, 1 waiting in barrier"


def test_stacks_file_says_why_and_is_private(tmp_path: Path) -> None:
    s = {0: RankStack(0, pid=12, where="t.py:1 in f", ok=True, text="Current thread 0x1 (most recent call first):\n")}
    path = tmp_path / "stacks.txt"
    assert stacks.write_file(str(path), "the agent received SIGTERM", s)
    text = path.read_text()
    assert "(the agent received SIGTERM)" in text and "=== rank 0 (pid 12): at t.py:1 in f" in text
    assert path.stat().st_mode & 0o777 == 0o600
    os.symlink(path, tmp_path / "link")
    assert not stacks.write_file(str(tmp_path / "link"), "x", s)  # never through a symlink


# -- NCCL flight recorder ----------------------------------------------------------------------
def test_nccl_env_respects_what_the_user_set(tmp_path: Path) -> None:
    env = hang.nccl_env({}, str(tmp_path))
    assert env == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": hang.NCCL_TRACE_ENTRIES,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{tmp_path}/nccl_trace_rank_",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{tmp_path}/nccl_pipe_rank_",
    }
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in hang.nccl_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, str(tmp_path))
    assert hang.gpu_present({"CUDA_VISIBLE_DEVICES": "0,1"})
    assert not hang.gpu_present({"CUDA_VISIBLE_DEVICES": ""})
    assert not hang.gpu_present({"CUDA_VISIBLE_DEVICES": "-1"})


def test_nccl_env_uses_the_names_each_torch_reads(tmp_path: Path) -> None:
    """torch 2.11 reads TORCH_FR_BUFFER_SIZE / TORCH_FR_DUMP_TEMP_FILE and warns on every rank at
    the old names (seen on the GPU machine's 2.11.0+cu130); 2.15 renames the dump on timeout too;
    2.4-2.10 read only the old names, where a new one would turn the recorder off."""
    d = str(tmp_path)
    assert set(hang.nccl_env({}, d, "2.4.1+cu121")) == set(hang.nccl_env({}, d))
    assert set(hang.nccl_env({}, d, "2.11.0+cu130")) == {
        "TORCH_FR_BUFFER_SIZE",
        "TORCH_NCCL_DUMP_ON_TIMEOUT",
        "TORCH_FR_DUMP_TEMP_FILE",
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
    }
    new = hang.nccl_env({}, d, "2.15.0")
    assert new["TORCH_FR_DUMP_ON_TIMEOUT"] == "1" and new["TORCH_FR_DUMP_TEMP_FILE"] == f"{d}/nccl_trace_rank_"
    # what the user set, under either name, is theirs: neither name is added
    assert not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & set(
        hang.nccl_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, d, "2.15.0")
    )
    assert not {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"} & set(
        hang.nccl_env({"TORCH_FR_BUFFER_SIZE": "0"}, d, "2.4.1")
    )


def test_nccl_dumps_are_found_and_the_pipes_asked(tmp_path: Path) -> None:
    (tmp_path / "nccl_trace_rank_1").write_bytes(b"\x80dump")
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80dump")
    pipe = tmp_path / "nccl_pipe_rank_0.pipe"
    os.mkfifo(pipe)
    os.mkfifo(tmp_path / "nccl_pipe_rank_1.pipe")  # nobody reads it: skipped, never blocks
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert hang.request_nccl_dumps(str(tmp_path)) == 1
        assert os.read(reader, 16) == b"1"
    finally:
        os.close(reader)
    assert hang.nccl_dumps(str(tmp_path)) == [str(tmp_path / "nccl_trace_rank_0"), str(tmp_path / "nccl_trace_rank_1")]


# -- progress --------------------------------------------------------------------------------
def test_progress_line_and_info() -> None:
    info = progress_info({"step": 120, "total": 1000, "time": 70.0, "first_step": 0, "first_time": 10.0}, rank=0)
    assert info == {"step": 120, "total": 1000, "rate": 2.0, "eta_s": 440.0, "rank": 0, "time": 70.0}
    assert progress_line(info) == "progress 120/1000 (12%), ETA 7m20s"
    assert progress_line({**info, "eta_s": 4000}) == "progress 120/1000 (12%), ETA 1h06m"
    assert progress_line({**info, "step": 1000}) == "progress 1000/1000 (100%)"
    assert progress_line(StepResult("a", "RUNNING", progress=info)) == progress_line(info)
    assert progress_line(StepResult("a", "RUNNING")) is None
    assert progress_info({"step": "x", "time": 1.0}) is None and progress_info([1]) is None
    # the result's progress survives its file
    back = StepResult.from_dict(json.loads(StepResult("a", "SUCCEEDED", progress=info).to_json()))
    assert back.progress == info


def test_worker_progress_writes_throttled_and_checks_its_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchstep
    import torchstep.worker as w

    path = tmp_path / "progress.0"
    monkeypatch.setenv("TORCHSTEP_PROGRESS_FILE", str(path))
    monkeypatch.setenv("TORCHSTEP_HEARTBEAT_FILE", str(tmp_path / "hb"))
    monkeypatch.setattr(w, "_progress_first", None)
    monkeypatch.setattr(w, "_progress_written", 0.0)
    torchstep.progress(1, 10)
    first = json.loads(path.read_text())
    torchstep.progress(2, 10)  # within 0.2 s: not written
    assert json.loads(path.read_text())["step"] == 1
    torchstep.progress(10, 10)  # the last step: always written
    last = json.loads(path.read_text())
    assert (first["step"], last["step"], last["total"], last["first_step"]) == (1, 10, 10, 1.0)
    assert (tmp_path / "hb").exists()  # progress is a heartbeat too
    for bad in (-1, "3", float("nan"), True):
        with pytest.raises(ValueError, match=r"progress\(step=\.\.\.\) must be a number >= 0"):
            torchstep.progress(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"progress\(total=\.\.\.\) must be a number > 0 or None"):
        torchstep.progress(1, 0)


def test_a_timer_and_a_heartbeat_kill_take_the_stacks_first(agents: Agents, tmp_path: Path) -> None:
    """The other stops the agent decides itself: an expired ``torchstep.expires()`` timer
    and ``--heartbeat-timeout`` name where every rank was, in the killed rank's message."""
    (tmp_path / "t").mkdir()
    (tmp_path / "h").mkdir()
    timer, t_ready = start_loader(agents, tmp_path / "t", nproc=2, mode="timer", name="t/agent")
    beat, h_ready = start_loader(
        agents, tmp_path / "h", "--heartbeat-timeout", "3", nproc=2, mode="silent", name="h/agent"
    )
    assert timer.wait(120) == 137, timer.diagnostics()
    assert beat.wait(120) == 137, beat.diagnostics()
    root = timer.result["root_cause"]
    assert (root["rank"], root["reason"]) == (1, "timer_expired")
    assert re.search(
        r"timer 'slow-step' expired .*; where the ranks were: rank 0 at hang\.py:\d+ in wait_forever; "
        r"rank 1 at hang\.py:\d+ in slow_step",
        root["message"],
    ), root
    ranks = {r["rank"]: r for r in timer.result["replicas"][0]["ranks"]}
    assert ranks[1]["stack"][0].endswith("in slow_step") and ranks[0]["stack"][0].endswith("in wait_forever")
    root = beat.result["root_cause"]
    assert root["reason"] == "heartbeat_timeout"
    assert "no torchstep.heartbeat() for" in root["message"]
    assert re.search(r"where the ranks were: ranks 0, 1 at hang\.py:\d+ in wait_forever", root["message"]), root


def test_a_cancelled_local_run_says_where_every_replicas_ranks_were(tmp_path: Path) -> None:
    """The local target's cancel (what an orchestrator's timeout or kill does) signals each
    agent's whole process group: the worker zygote must not kill the workers before their
    agent took the stacks. The step's message names the outlier across the replicas."""
    import torchstep
    from torchx.specs import AppDef, Role

    ready = tmp_path / "ready"
    ready.mkdir()
    role = Role(
        "trainer",
        image=str(tmp_path),
        entrypoint=sys.executable,
        num_replicas=2,
        args=[HANG, "--mode", "loader", "--rank", "1", "--dir", str(ready)],
    )
    cancel = threading.Event()
    out: list[StepResult] = []
    run = threading.Thread(
        target=lambda: out.append(
            torchstep.run_local(
                AppDef("stacks", roles=[role]), log_dir=str(tmp_path / "logs"), cancel=cancel, cfg={"grace_period": 5}
            )
        )
    )
    run.start()
    try:
        wait_for(lambda: len(ready_times(ready)) == 2 or not run.is_alive(), 120, "both ranks in place")
        time.sleep(0.3)  # rank 0 is inside all_reduce by now
    finally:
        cancel.set()
        run.join(90)
    assert not run.is_alive() and out, "run_local did not end"
    res = out[0]
    assert res.state == "CANCELLED"
    assert re.fullmatch(
        r"cancelled; where the ranks were: rank 1 at hang\.py:\d+ in load_batch; rank 0 waiting in all_reduce",
        res.message or "",
    ), res.message
    assert all(rep.stacks_file and Path(rep.stacks_file).is_file() for rep in res.replicas)
