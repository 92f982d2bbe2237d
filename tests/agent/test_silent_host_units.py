"""The liveness monitor's parts that need no network namespace (issue 36): the probe that tells
a stalled agent from a silent host, the shutdown that ends a store call blocked on a silent
store, and the removal of a dead node from torch's rendezvous state."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest
from torchstep.agent import compat
from torchstep.agent.liveness import LivenessMonitor, probe, resolve
from torchstep.agent.stores import shutdown_connections


def test_probe_tells_a_listening_agent_from_a_gone_one_and_an_unknown_name() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    # a listener that never accepts (its process stopped) still completes the handshake
    assert probe("127.0.0.1", port, 1.0) == "alive"
    server.close()
    assert probe("127.0.0.1", port, 1.0) == "gone"  # refused: the host answers, the agent is gone
    assert probe("no-such-host.invalid", port, 1.0) == "unknown"


def test_shutdown_connections_ends_a_call_blocked_on_a_store_that_does_not_answer() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    peer, _ = server.accept()  # connected, but it never answers: a silent store
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(client.recv(16)))
    reader.start()
    time.sleep(0.2)
    assert reader.is_alive()  # blocked, as torch's store client is
    assert shutdown_connections("127.0.0.1", port) == 1
    reader.join(timeout=5)
    assert not reader.is_alive() and got == [b""]
    assert shutdown_connections("127.0.0.1", port + 1 if port < 65535 else port - 1) == 0  # nobody else's
    for s in (client, peer, server):
        s.close()


def _state(nodes: list, complete: bool = True):
    from datetime import datetime, timezone

    state = compat.rdzv_state_class()()
    state.round = 3
    state.complete = complete
    state.participants = {n: i for i, n in enumerate(nodes)}
    state.last_heartbeats = {n: datetime.now(timezone.utc) for n in nodes}
    return state


def test_remove_rdzv_node_drops_a_node_as_torchs_expiry_does() -> None:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousSettings, RendezvousTimeout

    node = compat.rdzv_node_class()
    a, b = node("10.0.0.1", 11, 0), node("10.0.0.2", 22, 0)
    settings = RendezvousSettings("r", 1, 2, RendezvousTimeout(), timedelta(seconds=1), 1)
    state = _state([a, b])
    assert compat.remove_rdzv_node(state, b, settings)
    assert list(state.participants) == [a] and b not in state.last_heartbeats
    assert (state.round, state.complete) == (3, True)  # the survivor's round goes on
    assert compat.remove_rdzv_node(state, a, settings)
    assert (state.round, state.complete) == (4, False)  # an emptied round moves on: a new one forms
    assert not compat.remove_rdzv_node(state, a, settings)  # gone already: nothing changes


def test_no_monitor_where_nobody_can_go_silent() -> None:
    class Static:  # a static handler: no dynamic state to watch
        def get_backend(self) -> str:
            return "static"

    assert LivenessMonitor.create(Static(), "h:29400", fixed_size=True, on_silent=print, on_cut_off=print) is None


def test_probe_and_shutdown_use_addresses_looked_up_earlier_not_dns() -> None:
    # a node cut off is cut off from its DNS server too (a partitioned pod: 10 s per lookup,
    # then a failure): what was looked up while the network worked must still be usable
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    earlier = resolve("127.0.0.1")
    assert earlier and resolve("no-such-host.invalid") == []
    assert probe("no-such-host.invalid", port, 1.0, earlier) == "alive"  # no lookup of the name
    client = socket.create_connection(("127.0.0.1", port))
    peer, _ = server.accept()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(client.recv(16)))
    reader.start()
    assert shutdown_connections("no-such-host.invalid", port) == 0  # the name alone: nothing found
    assert shutdown_connections("no-such-host.invalid", port, ["127.0.0.1"]) == 1
    reader.join(timeout=5)
    assert not reader.is_alive() and got == [b""]
    for s in (client, peer, server):
        s.close()


def test_the_monitor_looks_a_peer_up_at_first_sight_and_probes_that_address_once_dns_is_gone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from torchstep.agent import liveness

    node = compat.rdzv_node_class()
    me, peer = node("me.example", 11, 0), node("peer.example", 22, 0)
    listener = socket.create_server(("127.0.0.1", 0))  # the peer's probe port
    dns_up, lookups = [True], []

    def fake_resolve(host: str) -> list:
        lookups.append(host)
        return [(socket.AF_INET, ("127.0.0.1", 0))] if dns_up[0] else []

    monkeypatch.setattr(liveness, "resolve", fake_resolve)
    silent: list = []
    monitor = LivenessMonitor.__new__(LivenessMonitor)  # _judge alone: no store, no threads
    monitor._node, monitor._seen, monitor._addrs, monitor._probed = me, {}, {}, {}
    monitor._ports = {str(peer): listener.getsockname()[1]}
    monitor.suspect_after_s, monitor.probe_timeout_s, monitor._on_silent = 0.0, 1.0, silent.append
    state = _state([me, peer])
    monitor._judge(state)  # first sight: looked up while DNS answers
    assert lookups == ["peer.example"]
    dns_up[0] = False  # this node's link (and its DNS) goes; the peer's heartbeat does not move
    monitor._judge(state)
    listener.settimeout(2.0)
    conn, _ = listener.accept()  # probed at the address looked up earlier, and it answered
    conn.close()
    listener.close()
    assert lookups == ["peer.example"] and not silent  # no second lookup; an answering peer is alive
