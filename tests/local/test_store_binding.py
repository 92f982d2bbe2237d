"""The stores of a local run answer only this machine, and the rendezvous id is no command-line
argument (issue 33): other users read every process's command line in /proc, and torch's
TCPStore listens on every interface unless it is handed a loopback socket."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from listeners import external_ip, listening
from local_testlib import BackgroundRun, pids_with, rank_log_has, role
from proclib import proc_cmdline, proc_environ, wait_for
from torchx import specs


def test_a_local_run_listens_on_loopback_only_and_keeps_its_rendezvous_id_off_the_command_line(
    log_dir: Path, no_leftovers: str
) -> None:
    app = specs.AppDef(
        "stores",
        roles=[role("solo", ["loop", "600", "0.1"]), role("pair", ["loop", "600", "0.1"], replicas=2)],
    )
    run = BackgroundRun(app, log_dir)
    try:
        wait_for(
            lambda: rank_log_has(log_dir, "solo", 0, "step 2") and rank_log_has(log_dir, "pair", 1, "step 2"),
            180,
            "both roles to train",
        )
        pids = set(pids_with(no_leftovers))
        sockets = listening(pids)
        # the store host, the one-replica agent's rendezvous store, both workers' stores, gloo
        assert len(sockets) >= 3, sockets
        assert all(addr == "127.0.0.1" for addr, _ in sockets), sockets
        ip = external_ip()
        if ip is not None:
            for _, port in sockets:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((ip, port), timeout=5).close()

        ids = {env["TORCHSTEP_RDZV_ID"] for env in map(proc_environ, pids) if "TORCHSTEP_RDZV_ID" in env}
        assert len(ids) == 2, ids  # one per role, the same for every replica of a role
        app_id = next(iter(ids)).split("-solo-")[0].split("-pair-")[0]
        assert not ({f"{app_id}-solo", f"{app_id}-pair"} & ids), "the rendezvous id is guessable from the app id"
        for pid in pids:
            cmd = proc_cmdline(pid)
            assert "--rdzv-id" not in cmd and not any(i in cmd for i in ids), cmd
    finally:
        run.stop(120)
    assert run.result(0).state == "CANCELLED"
    assert os.path.isdir(log_dir)
