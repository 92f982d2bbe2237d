"""A silent peer costs seconds, not a hang: the rendezvous liveness monitor.

A node that fails by going silent (a power loss, a NIC or switch port down, a frozen VM)
sends no reset: its peers' workers stay blocked in a gloo collective (30-minute default
timeout) and torch's agent, which only restarts on a worker failure or a waiting node,
waits with them. A node cut off from the rendezvous store blocks in a store call until TCP
gives up (~15 minutes).

The monitor runs beside the agent's main loop, on a store connection of its own, in two
threads:

* the **reader** reads the rendezvous state every ``tick_s`` and notes when each node's
  keep-alive heartbeat (torch's, every <= 1 s) last *changed*, on this machine's clock (no
  clock comparison across hosts). A node whose heartbeat has not changed for
  ``suspect_after_s`` while this agent reads the state fine is *probed*: a TCP connection to
  the port its agent listens on for exactly this (published in the store). A connection
  that completes means the host and the agent process are there (a stalled or stopped agent
  still completes it: the kernel answers), so nothing happens; a refusal (the agent is
  gone) or no answer within ``probe_timeout_s`` (the host is silent) makes the node dead:
  it is removed from the rendezvous state as torch removes an expired node. A node whose
  agent is gone had its connections reset, so its peers' workers fail by themselves and
  torch restarts as for any node loss. For a silent host the agent is told (``on_silent``):
  with ``--nnodes min:max`` it restarts its group at the smaller size (a membership change:
  no ``--max-restarts`` spent), with a fixed size it fails the step, naming the node.
* the **watcher** sees a store call of the reader's that has not returned for
  ``cut_after_s`` and probes the store's endpoint: no answer means this agent is cut off
  (or the store host is silent): the agent stops its workers at once (``on_cut_off``). With
  a fixed size its store connections are then shut down, so its main loop ends FAILED
  instead of hanging; elastic, it waits up to ``rejoin_s`` for the link to heal (its
  blocked calls then return and it rejoins at the next membership change), then fails the
  same way.

Only the c10d rendezvous backend has it (``etcd-v2`` and ``static``: none; the settings
line says nothing changes there).

Example (what :class:`torchstep.agent.elastic.TorchstepAgent` does)::

    monitor = LivenessMonitor.create(handler, "h0:29400", fixed_size=False, on_silent=f, on_cut_off=g)
    if monitor is not None:
        monitor.start()
    ...
    monitor.stop()
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from torchstep.agent import compat

__all__ = ["CUT_OFF", "PEER_SILENT", "LivenessMonitor", "Silence", "probe", "resolve"]

log = logging.getLogger("torchstep.agent")

#: :attr:`Silence.kind` of a peer that stopped answering.
PEER_SILENT = "peer_silent"
#: :attr:`Silence.kind` when this agent cannot reach the rendezvous store.
CUT_OFF = "cut_off"

#: :func:`probe` results.
ALIVE, GONE, SILENT, UNKNOWN = "alive", "gone", "silent", "unknown"


@dataclass(frozen=True)
class Silence:
    """What the monitor found.

    Attributes:
        kind: :data:`PEER_SILENT` or :data:`CUT_OFF`.
        node: the silent node (``addr_pid_localid``), or the store's ``host:port`` when cut off.
        addr: the node's (or the store's) host.
        group_rank: the node's group rank in the round it was found in (``None``: not a participant).
        round: that round (``None`` when cut off: this agent could not read it).
        message: one line for the log and the result's root cause.
        at: when it was found (``time.monotonic()``).
    """

    kind: str
    node: str
    addr: str
    group_rank: int | None
    round: int | None
    message: str
    at: float


def resolve(host: str) -> list[tuple[int, tuple[Any, ...]]]:
    """``host``'s addresses as :func:`probe` takes them, looked up now; empty when the name
    does not resolve.

    A monitor looks its peers and the store up while the network works: a node cut off is
    usually cut off from its DNS server too (a pod from the cluster's DNS), where a lookup
    waits for the resolver's timeouts (10 s measured on a partitioned pod) and then fails.

    Args:
        host: a host name or address.

    Returns:
        ``(family, sockaddr)`` pairs (the sockaddr's port is replaced when probing).
    """
    try:
        return [(info[0], info[4]) for info in socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)]
    except OSError:
        return []


def probe(host: str, port: int, timeout_s: float, resolved: list[tuple[int, tuple[Any, ...]]] | None = None) -> str:
    """Whether a TCP connection to ``host:port`` completes.

    Args:
        host: the host.
        port: the port.
        timeout_s: how long to wait for an answer (the kernel resends a lost SYN after 1 s).
        resolved: ``host``'s addresses from an earlier :func:`resolve`: nothing is looked up
            now; ``None`` or empty: ``host`` is looked up.

    Returns:
        ``"alive"`` (it completed), ``"gone"`` (refused: the host answers, nothing listens),
        ``"silent"`` (no answer in time, or no route), or ``"unknown"`` (the name does not resolve).
    """
    infos = resolved or resolve(host)
    if not infos:
        return UNKNOWN
    family, sockaddr = infos[0]
    addr = (sockaddr[0], port, *sockaddr[2:])
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(timeout_s)
    try:
        sock.connect(addr)
        return ALIVE
    except ConnectionRefusedError:
        return GONE
    except OSError as e:  # timeout, EHOSTUNREACH, ENETUNREACH
        if e.errno in (errno.ECONNRESET,):
            return GONE
        return SILENT
    finally:
        sock.close()


class _ProbeListener:
    """The port peers probe: it accepts and closes (nothing is read or written). It listens
    on the address peers reach this node by (the node's ``addr``: ``--local-addr`` or the host
    name), on loopback when the whole run is on this machine (a loopback store endpoint), and
    on every interface only when that address is not one of this host's."""

    def __init__(self, node_addr: str, store_host: str) -> None:
        from torchstep.agent.stores import LOOPBACK, loopback_ip

        if loopback_ip(store_host) is not None:  # the node's own loopback address (127.0.0.2: a "host" of a test)
            self.sock = socket.create_server((loopback_ip(node_addr) or LOOPBACK, 0), backlog=256)
        else:
            self.sock = self._bind_own(node_addr)
        self.port: int = self.sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="torchstep-liveness-probe", daemon=True)
        self._thread.start()

    @staticmethod
    def _bind_own(node_addr: str) -> socket.socket:
        try:
            family, _, _, _, addr = socket.getaddrinfo(node_addr, 0, type=socket.SOCK_STREAM)[0]
            return socket.create_server((addr[0], 0), family=family, backlog=256)
        except (OSError, IndexError):  # not an address of this host (NAT, an alias): every interface
            pass
        try:
            return socket.create_server(("", 0), family=socket.AF_INET6, backlog=256, dualstack_ipv6=True)
        except (OSError, ValueError):  # no IPv6 here
            return socket.create_server(("", 0), backlog=256)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            conn.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class LivenessMonitor:
    """See the module docstring.

    Example: ``LivenessMonitor.create(handler, "h0:29400", fixed_size=True, on_silent=f, on_cut_off=g)``.
    """

    def __init__(
        self,
        handler: Any,
        endpoint: str,
        *,
        fixed_size: bool,
        on_silent: Callable[[Silence], None],
        on_cut_off: Callable[[Silence], None],
        suspect_after_s: float = 2.0,
        probe_timeout_s: float = 1.5,
        cut_after_s: float = 3.0,
        rejoin_s: float = 60.0,
        tick_s: float = 0.5,
    ) -> None:
        found = compat.rdzv_node_and_settings(handler)
        if found is None:
            raise ValueError("not a dynamic rendezvous handler")
        self._node, self._settings = found
        self._run_id = str(handler.get_run_id())
        # torch's own parser: "[v6]:port", a host without a port (torch's 29400), "" (localhost)
        self.store_host, self.store_port = parse_rendezvous_endpoint(endpoint.strip(), default_port=29400)
        self.fixed_size = fixed_size
        self._on_silent = on_silent
        self._on_cut_off = on_cut_off
        self.suspect_after_s = suspect_after_s
        self.probe_timeout_s = probe_timeout_s
        self.cut_after_s = cut_after_s
        self.rejoin_s = rejoin_s
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._listener: _ProbeListener | None = None
        self._store: Any = None
        self._holder: Any = None
        self._call_since: float | None = None  # a store call of the reader in flight since
        # when a store call of the reader first *failed* (an error, not a stall) since the store
        # last answered: the store's process closed its connections (a partition sends nothing)
        self._error_at: float | None = None
        self._cut: Silence | None = None
        self._seen: dict[Any, tuple[Any, float]] = {}  # node -> (last heartbeat, when it changed here)
        self._ports: dict[str, int] = {}
        # addresses looked up while the network worked (a cut-off node has no DNS either):
        # per node (a replacement is a new node, looked up afresh) and the store's
        self._addrs: dict[Any, list[tuple[int, tuple[Any, ...]]]] = {}
        self._store_addrs: list[tuple[int, tuple[Any, ...]]] = []
        self._probed: dict[Any, float] = {}
        self._threads: list[threading.Thread] = []
        self._progress_pending = False
        #: The run's progress count (every agent's :meth:`note_progress`), as last read; -1: unknown.
        self.group_progress = -1

    @classmethod
    def create(cls, handler: Any, endpoint: str, **kwargs: Any) -> LivenessMonitor | None:
        """A monitor for ``handler``, or ``None`` where it cannot watch (not c10d over TCP,
        one node at most, or a torch without the names it needs: one log line says so).

        Args:
            handler: the rendezvous handler.
            endpoint: the rendezvous endpoint (``host:port``).
            **kwargs: the constructor's keyword arguments.

        Returns:
            The monitor (not started), or ``None``.
        """
        found = compat.rdzv_node_and_settings(handler)
        if found is None or getattr(handler, "get_backend", lambda: "")() != "c10d":
            return None
        if found[1].max_nodes <= 1 or compat.rdzv_state_holder(None, found[1]) is None:
            return None
        try:
            return cls(handler, endpoint, **kwargs)
        except Exception as e:  # never cost the run: it runs as before, without the monitor
            log.warning(
                "no liveness monitor (%s: %s): a silent node is found only by torch's expiry", type(e).__name__, e
            )
            return None

    # -- life ------------------------------------------------------------------------------
    def start(self) -> None:
        """Open the probe port and start both threads."""
        try:
            self._listener = _ProbeListener(str(self._node.addr), self.store_host)
        except OSError as e:  # peers then find this node silent only by torch's expiry
            log.warning("liveness: no probe port (%s): peers cannot probe this node", e)
        for target, name in ((self._read_loop, "reader"), (self._watch_loop, "watcher")):
            thread = threading.Thread(target=target, name=f"torchstep-liveness-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Stop the threads and close the probe port (a reader blocked in a store call is left
        to end with the process: it is a daemon)."""
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        for thread in self._threads:
            thread.join(timeout=0.1 if thread.name.endswith("reader") else 2.0)

    def note_progress(self) -> None:
        """This node's ranks made progress (``--hang-timeout``'s kind): counted in the run's
        shared progress count on the reader's next tick, so that every other agent sees it
        (:attr:`group_progress`). Never blocks: the main loop calls it."""
        self._progress_pending = True

    @property
    def cut_off(self) -> Silence | None:
        """The cut-off this agent is in, if any (cleared when the store answers again)."""
        return self._cut

    # -- a store move (torchstep.agent.store_move) ------------------------------------------
    def store_verdict(self) -> str:
        """A probe of the store's endpoint now, by the addresses looked up when it last
        answered: ``"gone"`` when its host refuses the connection (the store's process is gone)."""
        return probe(self.store_host, self.store_port, self.probe_timeout_s, self._store_addrs)

    def store_names(self) -> set[str]:
        """The store's host name and the addresses it had when it last answered."""
        return {self.store_host, *(str(addr[1][0]) for addr in self._store_addrs)}

    def release_store(self) -> int:
        """Shut this process's connections to the store down (the agent's blocked calls fail
        at once) while the monitor keeps watching: the store is about to move.

        Returns:
            How many connections were shut down.
        """
        from torchstep.agent.stores import shutdown_connections

        addresses = [str(a[1][0]) for a in self._store_addrs]
        return shutdown_connections(self.store_host, self.store_port, addresses)

    def store_ended(self) -> bool:
        """Whether the store's connections were closed before any call to it stalled: its
        process ended (a pod deleted, an agent killed), whatever a probe of its address says
        now (a deleted pod's address stops answering at all, like a partitioned one's)."""
        error_at, cut = self._error_at, self._cut
        return error_at is not None and (cut is None or cut.at >= error_at)

    def probe_node(self, node: Any) -> str:
        """A probe of ``node``'s agent on its liveness port (``"unknown"`` when this monitor
        never learnt the port: that node is passed over)."""
        port = self._ports.get(str(node))
        if not port:
            return UNKNOWN
        return probe(str(node.addr), port, self.probe_timeout_s, self._addrs.get(node))

    def retarget(self, handler: Any, endpoint: str) -> None:
        """Watch the rendezvous of ``handler`` (rebuilt on a moved store) at ``endpoint``:
        the reader connects there on its next tick; the cut-off ends."""
        found = compat.rdzv_node_and_settings(handler)
        if found is not None:
            self._node, self._settings = found
        self.store_host, self.store_port = parse_rendezvous_endpoint(endpoint.strip(), default_port=29400)
        self._store_addrs = resolve(self.store_host)
        self._store = None
        self._holder = None
        self._seen.clear()
        self._probed.clear()
        self._cut = None
        self._error_at = None

    # -- the reader ------------------------------------------------------------------------
    def _key(self, node: Any) -> str:
        return f"torchstep.liveness.{self._run_id}.{node}"

    def _call(self, fn: Callable[[], Any]) -> Any:
        self._call_since = time.monotonic()
        try:
            return fn()
        finally:
            self._call_since = None

    def _connect(self) -> None:
        from torch.distributed import TCPStore

        from torchstep.agent.rdzv_guard import guard_backend

        def connect() -> Any:
            return TCPStore(self.store_host, self.store_port, None, False, timedelta(seconds=5), wait_for_workers=False)

        store = self._call(connect)
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

        backend = self._call(lambda: C10dRendezvousBackend(store, self._run_id))
        self._holder = compat.rdzv_state_holder(
            guard_backend(backend, f"{self.store_host}:{self.store_port}"), self._settings
        )
        self._call(lambda: store.set(self._key(self._node), str(self._listener.port if self._listener else 0)))
        self._store_addrs = resolve(self.store_host) or self._store_addrs  # the store just answered there
        self._store = store

    def _read_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last > self.tick_s + 1.5:
                self._seen.clear()  # this process was stopped or starved: nothing is known to be old
            last = now
            try:
                if self._store is None:
                    self._connect()
                self._call(self._holder.sync)
            except Exception as e:
                if self._stop.is_set():
                    return
                if self._error_at is None and self._cut is None and time.monotonic() - now < self.cut_after_s:
                    self._error_at = time.monotonic()
                log.debug("liveness: reading the rendezvous state failed: %s: %s", type(e).__name__, e)
                self._store = None  # a fresh connection next time
                self._stop.wait(self.tick_s)
                continue
            self._error_at = None
            if self._cut is not None:
                log.warning("liveness: the rendezvous store at %s:%d answers again", self.store_host, self.store_port)
                self._cut = None
                self._seen.clear()
            try:
                self._judge(self._holder.state)
            except Exception as e:  # a bug here must not stop the watching
                log.warning("liveness: %s: %s", type(e).__name__, e)
            try:
                self._share_progress()
            except Exception as e:  # the next tick tries again (the reader's own call: the watcher sees a stall)
                log.debug("liveness: sharing progress failed: %s: %s", type(e).__name__, e)
            self._stop.wait(self.tick_s)

    def _share_progress(self) -> None:
        """One round trip: this node's progress since the last tick added, the run's count read."""
        delta, self._progress_pending = (1 if self._progress_pending else 0), False
        key = f"torchstep.progress.{self._run_id}"
        store = self._store
        self.group_progress = int(self._call(lambda: store.add(key, delta)))

    def _judge(self, state: Any) -> None:
        if state.closed:
            return
        now = time.monotonic()
        beats = dict(state.last_heartbeats)
        for node in list(self._seen):
            if node not in beats:
                del self._seen[node]
                self._addrs.pop(node, None)
        for node, beat in beats.items():
            if node == self._node:
                continue
            if node not in self._addrs:  # first sight: its heartbeat reached the store, its name resolves now
                self._addrs[node] = resolve(str(node.addr))
            if str(node) not in self._ports:  # its probe port, known before a store move needs it
                with contextlib.suppress(Exception):
                    self._port_of(node)
            seen = self._seen.get(node)
            if seen is None or seen[0] != beat:
                self._seen[node] = (beat, now)
                continue
            age = now - seen[1]
            if age < self.suspect_after_s or now - self._probed.get(node, 0.0) < 1.0:
                continue
            self._probed[node] = now
            port = self._port_of(node)
            if port is None:
                continue  # an agent without the monitor: torch's own expiry applies
            addr = str(node.addr)
            verdict = probe(addr, port, self.probe_timeout_s, self._addrs.get(node))
            if verdict in (ALIVE, UNKNOWN):
                if verdict == ALIVE and age > 2 * self.suspect_after_s:
                    log.info("liveness: node %s sent no heartbeat for %.1fs but its host answers: waiting", node, age)
                continue
            why = "its agent is gone (connection refused)" if verdict == GONE else "its host does not answer"
            rank = state.participants.get(node)
            silence = Silence(
                kind=PEER_SILENT,
                node=str(node),
                addr=addr,
                group_rank=rank,
                round=int(state.round),
                message=(
                    f"node {addr} (group rank {rank}, {node}) went silent: no rendezvous heartbeat for {age:.1f}s "
                    f"and {why} (probe of {addr}:{port})"
                ),
                at=now,
            )
            if not self._remove(node, beat):
                continue
            self._seen.pop(node, None)
            if verdict == GONE:
                # its processes are gone, so its connections were reset: the workers' collective
                # fails by itself and torch restarts as for any node loss; the removal only saves
                # the re-rendezvous torch's 30 s expiry
                log.warning("liveness: %s; removed it from the rendezvous", silence.message)
            else:
                log.error("liveness: %s; removed it from the rendezvous", silence.message)
                if rank is not None:
                    self._on_silent(silence)

    def _port_of(self, node: Any) -> int | None:
        key = str(node)
        if key not in self._ports:
            name = self._key(node)
            if not self._call(lambda: self._store.check([name])):
                return None
            value = self._call(lambda: self._store.get(name))
            self._ports[key] = int(value)
        return self._ports[key] or None

    def _remove(self, node: Any, beat: Any) -> bool:
        """Remove ``node`` from the shared state (compare-and-set, a few tries): ``False``
        when its heartbeat moved meanwhile (it is alive after all)."""
        for _ in range(5):
            state = self._holder.state
            if state.last_heartbeats.get(node, beat) != beat:
                return False
            if not compat.remove_rdzv_node(state, node, self._settings):
                return True  # someone removed it already
            self._holder.mark_dirty()
            if self._call(self._holder.sync):
                return True
        return False

    # -- the watcher -----------------------------------------------------------------------
    def _watch_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.25):
            now = time.monotonic()
            stalled = now - last > 1.5
            last = now
            since = self._call_since
            if since is None:
                continue
            if stalled:
                self._call_since = now  # this process was stopped: give the call a fresh window
                continue
            if self._cut is not None:
                if not self.fixed_size and now - self._cut.at > self.rejoin_s:
                    self._give_up(f"no answer for {self.rejoin_s:g}s")
                continue
            if now - since < self.cut_after_s:
                continue
            endpoint = f"{self.store_host}:{self.store_port}"
            verdict = probe(self.store_host, self.store_port, self.probe_timeout_s, self._store_addrs)
            if verdict == ALIVE:
                continue  # the store's host answers (its process may be stalled): wait
            if self._call_since is None:
                continue  # the call returned meanwhile
            self._cut = Silence(
                kind=CUT_OFF,
                node=endpoint,
                addr=self.store_host,
                group_rank=None,
                round=None,
                message=(
                    f"cut off from the rendezvous store at {endpoint}: a store call has not returned "
                    f"for {now - since:.1f}s and the store's host does not answer"
                ),
                at=now,
            )
            log.error("liveness: %s; stopping the workers", self._cut.message)
            self._on_cut_off(self._cut)
            if self.fixed_size:
                self._give_up("--nnodes is fixed")

    def _give_up(self, why: str) -> None:
        """End the agent's wait on the store: its blocked calls fail at once."""
        from torchstep.agent.stores import shutdown_connections

        count = shutdown_connections(self.store_host, self.store_port, [str(a[1][0]) for a in self._store_addrs])
        log.error(
            "liveness: giving up on the rendezvous store at %s:%d (%s): %d connection(s) shut down",
            self.store_host,
            self.store_port,
            why,
            count,
        )
        self._stop.set()
