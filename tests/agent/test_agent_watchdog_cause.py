"""The watchdog says where the agent is stuck: a store call that never returns (found by the
soak's ``rdzv_stall`` fault, where the message only said "no progress for 60s")."""

from __future__ import annotations

import threading
import time

from torchstep.agent.watchdog import ProgressWatchdog, stuck_in

# a blocking call compiled as if it were torch's (stuck_in reads the frames' file names)
_FAKE_TORCH = """
class DynamicRendezvousHandler:
    def num_nodes_waiting(self, release):
        release.wait(30)

def invoke_run(release):
    DynamicRendezvousHandler().num_nodes_waiting(release)
"""


def _blocked_in_fake_torch() -> tuple[threading.Thread, threading.Event]:
    scope: dict[str, object] = {}
    exec(compile(_FAKE_TORCH, "/site-packages/torch/distributed/elastic/rendezvous/fake.py", "exec"), scope)
    release = threading.Event()
    t = threading.Thread(target=scope["invoke_run"], args=(release,), daemon=True)  # type: ignore[arg-type]
    t.start()
    time.sleep(0.2)
    return t, release


def test_stuck_in_names_the_torch_distributed_call_a_thread_is_blocked_in() -> None:
    t, release = _blocked_in_fake_torch()
    try:
        assert stuck_in(t.ident) == "invoke_run -> DynamicRendezvousHandler.num_nodes_waiting"
        assert stuck_in() is None  # the test's own main thread is not in torch.distributed
    finally:
        release.set()
        t.join()


def test_the_watchdogs_reason_names_a_hung_rendezvous_store_call(monkeypatch) -> None:
    t, release = _blocked_in_fake_torch()
    import torchstep.agent.watchdog as wd_module

    # the watchdog looks at the main thread: here, the blocked one plays it
    monkeypatch.setattr(wd_module, "stuck_in", lambda: stuck_in(t.ident))
    fired: list[str] = []
    wd = ProgressWatchdog(0.2, on_fire=fired.append, any_alive=lambda: False, period=0.05)
    try:
        wd.start()
        wd.phase("monitoring")
        deadline = time.monotonic() + 10
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        wd.stop()
        release.set()
        t.join()
    assert fired, "the watchdog never fired"
    assert "no progress" in fired[0]
    assert "blocked in torch.distributed: invoke_run -> DynamicRendezvousHandler.num_nodes_waiting" in fired[0]
    assert fired[0].endswith("(the rendezvous store does not answer)")
