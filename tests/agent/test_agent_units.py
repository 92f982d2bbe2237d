"""The agent's pieces without running workers: import cost, worker API, exit-code mapping,
log tee — fast, but real (no mocks of torch). Settings: test_agent_settings.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from io import StringIO

import pytest
from agent_testlib import clean_env
from torchstep import NON_RETRYABLE_EXIT_CODE


def _py(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env=clean_env(env), capture_output=True, text=True, timeout=120)


def test_importing_torchstep_worker_and_agent_does_not_import_torch() -> None:
    out = _py(
        "import sys, torchstep, torchstep.worker, torchstep.agent; "
        "torchstep.record, torchstep.expires, torchstep.heartbeat, torchstep.output, torchstep.agent.shims_dir(); "
        "print('torch' in sys.modules)"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_worker_api_is_a_noop_without_the_agent(tmp_path) -> None:
    out = _py(
        "import sys, torchstep\n"
        "torchstep.heartbeat(); torchstep.output('x', [1, 2])\n"
        "with torchstep.expires(after=0.01): pass\n"
        "print('torch' in sys.modules)"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"  # no agent: the timer is not even set up


def test_output_keeps_json_values_and_rejects_others(tmp_path, monkeypatch) -> None:
    import torchstep.worker as w

    path = tmp_path / "out.json"
    monkeypatch.setenv(w.OUTPUT_FILE_ENV, str(path))
    w.output("loss", 0.25)
    w.output("ckpt", {"path": "s3://b/k", "step": 3})
    w.output("loss", 0.125)
    assert json.loads(path.read_text()) == {"loss": 0.125, "ckpt": {"path": "s3://b/k", "step": 3}}
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        w.output("bad", object())
    with pytest.raises(ValueError, match="non-empty string"):
        w.output("", 1)


def test_heartbeat_touches_its_file(tmp_path, monkeypatch) -> None:
    import torchstep.worker as w

    path = tmp_path / "hb"
    monkeypatch.setenv(w.HEARTBEAT_FILE_ENV, str(path))
    monkeypatch.setattr(w, "_last_heartbeat", 0.0)
    w.heartbeat()
    first = path.stat().st_mtime_ns
    time.sleep(0.06)
    w.heartbeat()
    assert path.stat().st_mtime_ns > first


def test_record_writes_an_error_file_torch_can_read(tmp_path) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = tmp_path / "error.json"
    out = _py(
        "import torchstep\n@torchstep.record\ndef main():\n    raise KeyError('missing')\nmain()",
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    assert out.returncode == 1 and "KeyError" in out.stderr
    failure = ProcessFailure(local_rank=0, pid=1, exitcode=1, error_file=str(error_file))
    assert failure.message["message"] == "KeyError: 'missing'"
    assert "line 4, in main" in failure.message["extraInfo"]["py_callstack"]
    ours = json.loads(error_file.read_text())["torchstep"]
    assert ours["retryable"] is True and ours["exception"] == "KeyError" and abs(ours["timestamp"] - time.time()) < 60


def test_record_turns_non_retryable_error_into_exit_82(tmp_path) -> None:
    error_file = tmp_path / "error.json"
    out = _py(
        "import torchstep\n@torchstep.record\ndef main():\n    raise torchstep.NonRetryableError('bad config')\nmain()",
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
    )
    assert out.returncode == NON_RETRYABLE_EXIT_CODE
    assert "NonRetryableError: bad config" in out.stderr  # the traceback is still printed
    data = json.loads(error_file.read_text())
    assert data["torchstep"] == {
        **data["torchstep"],
        "retryable": False,
        "exception": "torchstep.errors.NonRetryableError",
    }


def test_exit_codes_and_non_retryable_detection() -> None:
    from torchstep.agent.outcome import exit_code_for
    from torchstep.contract import is_non_retryable as failure_is_non_retryable

    assert [exit_code_for(exit_code=c) for c in (1, 3, -9, -15)] == [1, 3, 137, 143]
    torch_record = {
        "message": {"message": "NonRetryableError: x", "extraInfo": {"py_callstack": "...", "timestamp": "1"}}
    }
    assert failure_is_non_retryable(1, torch_record)
    assert failure_is_non_retryable(82, None)
    assert not failure_is_non_retryable(1, {"message": {"message": "ValueError: x", "extraInfo": {}}})
    assert not failure_is_non_retryable(-9, {"message": "<NONE>"})


def test_log_tee_prefixes_whole_lines_and_drains_at_stop(tmp_path) -> None:
    from torchstep.agent.tee import LogTee, TeeSource

    log = tmp_path / "rank0.log"
    dst = StringIO()
    tee = LogTee(
        [TeeSource(str(log), "[r/0] "), TeeSource(str(tmp_path / "never"), "[r/1] ")], dst, interval=0.01
    ).start()
    with open(log, "w", buffering=1) as f:
        f.write("hello ")
        time.sleep(0.1)  # a print split in two writes must still be one line
        f.write("world\nprogress 10%\rprogress 100%\nno newline at the end")
    tee.stop()
    assert dst.getvalue() == "[r/0] hello world\n[r/0] progress 100%\n[r/0] no newline at the end\n"


def test_a_worker_being_started_is_never_taken_for_an_adopted_orphan() -> None:
    """Between torch's fork of a worker and the agent watching its pid, the orphan sweeper
    (the agent is a subreaper) must not adopt it (it did under load: a WARNING "adopted 2
    orphaned process(es)" naming the two workers of a replica)."""
    from torchstep.agent.procs import ExitWatcher, OrphanSweeper, Reaper

    exits = ExitWatcher()
    sweeper = OrphanSweeper(Reaper(results=[], run_dir=None), exits)
    children: list[subprocess.Popen[bytes]] = []
    try:
        with exits.starting():
            children.append(subprocess.Popen(["sleep", "30"]))  # forked, not watched yet
            assert children[0].pid not in sweeper.sweep()
            exits.watch(children[0].pid)
        assert children[0].pid not in sweeper.sweep()  # watched: a worker
        children.append(subprocess.Popen(["sleep", "30"]))  # nobody watches it: an orphan
        assert children[1].pid in sweeper.sweep()
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_torchrun_shim_runs_the_agent() -> None:
    from torchstep.agent import shims_dir

    shim = os.path.join(shims_dir(), "torchrun")
    out = subprocess.run(
        [shim, "--help"],
        env=clean_env({"TORCHSTEP_PYTHON": sys.executable}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "torchstep-agent" in out.stdout and "--heartbeat-timeout" in out.stdout


def test_log_tee_on_a_pipe_keeps_bytes_in_the_file_and_utf8_on_the_console(tmp_path) -> None:
    """The rank file gets the bytes as written; the console gets whole prefixed lines, invalid
    UTF-8 replaced; the tail holds the last lines as text."""
    from torchstep.agent.logs import open_pipe
    from torchstep.agent.tee import LogTee, TeeSource

    pipe = open_pipe(str(tmp_path / "f0"), str(tmp_path / "rank0.log"))
    assert pipe is not None
    src = TeeSource(pipe.sink.path, "[r/0] ", pipe=pipe)
    console = tmp_path / "console"
    with open(console, "w") as dst:
        tee = LogTee([src], dst).start()
        fd = os.open(pipe.fifo, os.O_WRONLY)
        written = b"".join(b"line %d\n" % i for i in range(60)) + b"bad \xff\xfe\nbar 1\rbar 2\n\npartial"
        os.write(fd, written)
        os.close(fd)
        tee.stop()
    assert (tmp_path / "rank0.log").read_bytes() == written
    lines = console.read_text().split("\n")
    assert lines[:2] == ["[r/0] line 0", "[r/0] line 1"] and len(lines) == 60 + 4 + 1
    assert lines[60:] == ["[r/0] bad \ufffd\ufffd", "[r/0] bar 2", "[r/0] ", "[r/0] partial", ""]
    tail = list(src.tail)
    assert len(tail) == 50 and tail[-4:] == ["bad \ufffd\ufffd", "bar 2", "", "partial"] and tail[0] == "line 14"


def test_a_private_rendezvous_gets_a_slow_keep_alive() -> None:
    from types import SimpleNamespace

    from torchstep.agent.runner import private_rendezvous

    assert private_rendezvous(SimpleNamespace(max_nodes=1, rdzv_endpoint="localhost:0"))
    assert not private_rendezvous(SimpleNamespace(max_nodes=2, rdzv_endpoint="localhost:0"))
    assert not private_rendezvous(SimpleNamespace(max_nodes=1, rdzv_endpoint="node0:29500"))


def test_a_restart_is_counted_once_its_workers_start_not_when_it_is_cut_short(monkeypatch) -> None:
    """Found by the soak: a peer's non-retryable failure stopped the run while this agent's
    restart was still in its rendezvous, and the result said ``restarts: 1`` although no
    worker ran again."""
    from types import SimpleNamespace

    from torch.distributed.elastic.agent.server.api import WorkerState
    from torchstep.agent.elastic import TorchstepAgent

    owner = next(c for c in TorchstepAgent.__mro__[1:] if "torch_restart_workers" in vars(c))
    agent = TorchstepAgent.__new__(TorchstepAgent)  # the counters only: no workers, no rendezvous
    agent.failure_restarts = agent.membership_restarts = 0
    group = SimpleNamespace(state=WorkerState.FAILED)

    def cut_short(self, worker_group) -> None:
        raise RuntimeError("the rendezvous was closed")

    monkeypatch.setattr(owner, "torch_restart_workers", cut_short)
    with pytest.raises(RuntimeError):
        agent._restart_workers(group)
    assert (agent.failure_restarts, agent.membership_restarts) == (0, 0)

    monkeypatch.setattr(owner, "torch_restart_workers", lambda self, worker_group: None)
    agent._restart_workers(group)
    group.state = WorkerState.HEALTHY  # a node joined: a membership change, not the budget
    agent._restart_workers(group)
    assert (agent.failure_restarts, agent.membership_restarts) == (1, 1)


def test_peers_that_die_after_the_agent_kills_a_stuck_rank_are_collateral_not_culprits(tmp_path) -> None:
    """Found by CI under load: after ``--hang-timeout`` killed rank 2, ranks 0 and 1 (their
    all_reduce broken) exited on their own before the agent began its stop, and the result
    named them ``worker_failed`` beside the culprit. A rank that failed before the kill is
    still a failure of its own."""
    from torchstep.agent.elastic import FAILED, GroupStart, WorkerRecord
    from torchstep.agent.logs import rank_paths
    from torchstep.agent.outcome import rank_result
    from torchstep.agent.procs import ExitInfo

    def worker(rank: int, exit_at: float, code: int, reason: str | None = None) -> WorkerRecord:
        paths = rank_paths(str(tmp_path), rank, merge_streams=True)
        return WorkerRecord(
            rank, rank, paths, "", pid=1000 + rank, exit=ExitInfo(exit_at, code), dead_before_stop=True, reason=reason
        )

    attempt = GroupStart(0, 0, 0, 1, 4, 90.0, str(tmp_path), state=FAILED, stop_started_at=101.0)
    attempt.culprit_killed_at = 100.0
    attempt.workers = {
        0: worker(0, 100.4, 1),
        1: worker(1, 100.5, 1),
        2: worker(2, 100.0, -9, "hang_timeout"),
        3: worker(3, 99.0, 1),  # failed before the kill: its own failure
    }
    reasons = {r: rank_result(attempt, w, role="t", replica_id=0).reason for r, w in attempt.workers.items()}
    assert reasons == {0: "stopped", 1: "stopped", 2: "hang_timeout", 3: "worker_failed"}
    attempt.culprit_killed_at = None  # no kill by the agent: dying before the stop is failing
    assert rank_result(attempt, attempt.workers[0], role="t", replica_id=0).reason == "worker_failed"


def test_a_one_node_rendezvous_on_localhost_without_a_port_is_private() -> None:
    """torch's c10d handler reads ``localhost`` as localhost:29400: its store must listen on
    loopback only, as for ``localhost:29500`` (the hand-written split took the host for a port
    and left it on every interface)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torchstep.agent.stores import is_private

    def params(endpoint: str, max_nodes: int = 1) -> RendezvousParameters:
        return RendezvousParameters("c10d", endpoint, "run", 1, max_nodes)

    assert is_private(params("localhost")) and is_private(params("127.0.0.1:29500")) and is_private(params("h0:0"))
    assert is_private(params("[::1]:0"))
    assert not is_private(params("localhost", max_nodes=2))
    assert not is_private(params("node0.example.invalid:29500"))
    assert not is_private(params("localhost:notaport"))  # torch's handler names the error
