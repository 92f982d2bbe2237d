"""The rendezvous store moves to a survivor when the agent that hosted it is gone.

With the c10d backend the rendezvous store lives in one agent (torchrun's design: the node
whose host name is the endpoint's, replica 0 of a rendered Kubernetes role). When that agent
dies — its pod deleted, its process killed, its container OOM-killed — every other agent
loses the store: torchrun's survivors fail at their next store call, and a Kubernetes role
could only go on by replacing every pod. With ``--rdzv-conf store_takeover=on`` (elastic
``--nnodes min:max`` only) the survivors build a new store instead and go on training at the
smaller size:

1. at the next rendezvous (the survivors' workers failed with the lost node's, or the
   liveness monitor stopped them), an agent judges whether the store's process ended: its
   host *refuses* a connection, or does not answer now while the store's connections were
   closed before any call stalled (a deleted pod's address stops answering altogether); a
   store that stopped answering first is a partition: nothing moves, see below;
2. every survivor picks the same successor from the last round it was part of: the
   participant with the lowest group rank that is not on the lost store's host and whose
   agent a probe of its liveness port (:mod:`torchstep.agent.liveness`) does not find gone;
3. the successor hosts a new store on its own address and the endpoint's port, the others
   connect to it (waiting up to ``read_timeout`` for it), and each agent's rendezvous handler
   is rebuilt on the new store: the next rendezvous forms the group of the survivors, a
   membership change like any node loss.

An agent that starts later with the original endpoint (the lost node's replacement, a late
joiner) looks for a moved store first on the hosts ``--rdzv-conf store_candidates=h1|h2``
names (:func:`find_moved`); where none is named it cannot know, and would host a store of
its own at the original endpoint (so the option is refused without them). An agent whose store connection broke while the endpoint
answers again (the lost node's replacement hosts there already) rebuilds its handler on that
store, so the run meets again there instead of failing.

A store host that went *silent* (a partition, a power loss: nothing tells the two apart) is
decided by a majority of the last round, so that the run never splits in two: the agents cut
off from the store move it only when they, without the store's host, are more than half of
that round's nodes and answer each other's probes (:func:`holds_majority`); and an agent
that sees its peers go silent stops its workers instead of training on at the smaller size
when it reaches fewer than half of them (:func:`outvoted`): it waits for the moved store on
the candidates and rejoins the run there once its link heals. An even split (two nodes) is
decided by the run's witness where ``--rdzv-conf store_witness=kubernetes`` names one
(:mod:`torchstep.agent.witness`: the half whose claim of a Lease gets through goes on);
without one it keeps the store where it is: the store's host trains on and the other one
stops its workers, as before. Not moved: a fixed ``--nnodes N`` (the world cannot form again at another size:
the step fails, retryable).

Example (what :class:`torchstep.agent.elastic.TorchstepAgent` does at a rendezvous)::

    if enabled(config.rdzv_configs) and store_gone(monitor):
        successor = choose_successor(participants, me, monitor.probe_node, store_host=monitor.store_names())
        endpoint = move(handler, params, successor, me, port)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from torchstep.agent import compat
from torchstep.agent.liveness import GONE, SILENT

__all__ = [
    "CANDIDATES_CONF",
    "EVEN",
    "MAJORITY",
    "MINORITY",
    "MOVED_KEY",
    "TAKEOVER_CONF",
    "StoreMoveError",
    "answering",
    "candidates",
    "choose_successor",
    "enabled",
    "endpoint_of",
    "find_moved",
    "holds_majority",
    "move",
    "outvoted",
    "side",
    "torch_supports",
]

log = logging.getLogger("torchstep.agent")

#: ``--rdzv-conf`` key that turns the move on (``on``/``off``; default off).
TAKEOVER_CONF = "store_takeover"


class StoreMoveError(RendezvousConnectionError):
    """The store could not be moved (no survivor answers, the new store cannot be hosted or
    reached): the run fails as a rendezvous failure, retryable, as when the store is lost
    without a move."""


def enabled(rdzv_configs: Mapping[str, Any], *, min_nodes: int, max_nodes: int) -> bool:
    """Whether the store may move: ``store_takeover=on`` and an elastic node range.

    Args:
        rdzv_configs: ``--rdzv-conf`` as torch parsed it.
        min_nodes: ``--nnodes``' lower bound.
        max_nodes: its upper bound.

    Returns:
        ``True`` when it is on.

    Example: ``enabled({"store_takeover": "on"}, min_nodes=1, max_nodes=3)`` is ``True``;
    with ``min_nodes=3`` it is ``False`` (a fixed size fails fast instead).
    """
    value = str(rdzv_configs.get(TAKEOVER_CONF, "off")).strip().lower()
    return value in ("1", "on", "true", "yes") and min_nodes < max_nodes


#: What the agent says where torch is too old for the move (once, in the result's warnings).
UNSUPPORTED = (
    "store_takeover is off on torch 2.4: there the first group formed after a move hangs in "
    "init_process_group (about one move in eight under load, and every restart after it); "
    "the store stays in its agent, as under torchrun (fix: torch 2.5 or newer)"
)


def torch_supports() -> bool:
    """Whether this torch may move the store: 2.5 and newer (on 2.4 the workers of the first
    group after a move hang in ``init_process_group``, the restarts' too: issue 36, measured
    with the torch matrix's oldest row).

    Example: ``torch_supports()`` is ``True`` on torch 2.13.
    """
    import torch

    parts = str(torch.__version__).split("+", 1)[0].split(".")
    return (int(parts[0]), int(parts[1])) >= (2, 5)


def choose_successor(
    participants: Mapping[Any, int], me: Any, verdict: Callable[[Any], str], *, store_host: Collection[str] = ()
) -> Any | None:
    """The node that hosts the new store: the lowest group rank that may still be there.

    Every survivor calls this on the same round's participants, so they agree. Passed over:
    the nodes on the lost store's host (their agent hosted it: the store lives in the agent's
    process) and those whose agent a probe finds gone or silent. A node whose probe port is
    not known yet (the store was lost right after the round formed) counts as there: every
    survivor judges it alike, where a probe could answer differently from one to the next.

    Args:
        participants: the last round's participants and their group ranks.
        me: this agent's node.
        verdict: a probe of a node's agent (``"alive"``, ``"gone"``, ``"silent"``, ``"unknown"``).
        store_host: the lost store's host name and addresses.

    Returns:
        The node, or ``None`` when none is left.

    Example: with ``a`` on the store's host, ``choose_successor({a: 0, b: 1, c: 2}, c,
    lambda n: "alive", store_host={a.addr})`` is ``b``.
    """
    for node, _ in sorted(participants.items(), key=lambda item: item[1]):
        if node == me:
            return me
        if str(node.addr) in store_host or verdict(node) in (GONE, SILENT):
            continue
        return node
    return None


def answering(
    participants: Mapping[Any, int], me: Any, verdict: Callable[[Any], str], *, store_host: Collection[str] = ()
) -> list[Any]:
    """The nodes of a round that answer now: this node, and every other one whose agent a
    probe finds there (``"alive"``), leaving out those on ``store_host``. The probes run at
    once, so a round with several silent nodes costs one probe timeout, not one each. A node
    whose probe port is not known does not count: a majority is never assumed.

    Args:
        participants: the round's participants and their group ranks.
        me: this agent's node.
        verdict: a probe of a node's agent.
        store_host: host names and addresses whose nodes are left out (the silent store's).

    Returns:
        The nodes, by group rank.

    Example: ``answering({a: 0, b: 1, c: 2}, c, lambda n: "alive", store_host={a.addr})`` is ``[b, c]``.
    """
    from concurrent.futures import ThreadPoolExecutor

    from torchstep.agent.liveness import ALIVE

    others = [n for n in participants if n != me and str(n.addr) not in store_host]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(others)))) as pool:
        verdicts = dict(zip(others, pool.map(verdict, others), strict=True))
    found = [n for n in others if verdicts[n] == ALIVE] + ([me] if me in participants else [])
    return sorted(found, key=lambda n: participants[n])


#: What :func:`side` says of the nodes that answer here: more than half of the round, half, fewer.
MAJORITY, EVEN, MINORITY = "majority", "even", "minority"


def side(
    participants: Mapping[Any, int], me: Any, verdict: Callable[[Any], str], *, store_host: Collection[str] = ()
) -> tuple[str, int]:
    """Which side of a split this node is on: the nodes that answer here (:func:`answering`,
    those on ``store_host`` left out) against the last round's count.

    Returns:
        :data:`MAJORITY`, :data:`EVEN` or :data:`MINORITY`, and how many answer.

    Example: of three nodes, ``side({a: 0, b: 1, c: 2}, c, lambda n: "alive", store_host={a.addr})``
    is ``("majority", 2)``; of two, the one left is ``("even", 1)``.
    """
    count = len(answering(participants, me, verdict, store_host=store_host))
    twice, total = 2 * count, len(participants)
    return (MAJORITY if twice > total else EVEN if twice == total else MINORITY), count


def holds_majority(
    participants: Mapping[Any, int], me: Any, verdict: Callable[[Any], str], *, store_host: Collection[str]
) -> bool:
    """Whether the agents that lost a *silent* store may move it: those that answer, without
    the store's host, are more than half of the last round. The store's side then holds fewer
    than half, and stops its workers (:func:`outvoted`): one run, never two.

    Example: of three nodes, the two that are not on the silent store's host and answer each
    other hold it; of two nodes, the one left does not (an even split keeps the store).
    """
    return side(participants, me, verdict, store_host=store_host)[0] == MAJORITY


def outvoted(participants: Mapping[Any, int], me: Any, verdict: Callable[[Any], str]) -> bool:
    """Whether an agent whose peers went silent is on the smaller side of a split: it reaches
    fewer than half of the last round's nodes (itself included), so the others may hold a
    majority and move the store (:func:`holds_majority`); it must not train on alone. An even
    split is not outvoted: the side of the store keeps it.

    Example: the store's host of three nodes whose two peers went silent is outvoted; of two
    nodes it is not.
    """
    return side(participants, me, verdict)[0] == MINORITY


#: ``--rdzv-conf`` key: where a moved store may be, ``|``-separated hosts (the endpoint's port).
CANDIDATES_CONF = "store_candidates"
#: The key a moved store holds (value: the endpoint it replaced), so a late agent can find it.
MOVED_KEY = "torchstep.store_moved.{run_id}"


def candidates(rdzv_configs: Mapping[str, Any]) -> list[str]:
    """The hosts of ``--rdzv-conf store_candidates=h1|h2`` (where a launcher says a moved
    store may be: a Kubernetes role's other replicas).

    Example: ``candidates({"store_candidates": "a|b"})`` is ``["a", "b"]``.
    """
    return [h.strip() for h in str(rdzv_configs.get(CANDIDATES_CONF, "")).split("|") if h.strip()]


def endpoint_of(host: str, port: int) -> str:
    """``host:port`` as torch's endpoint parser reads it (an IPv6 address in brackets).

    Example: ``endpoint_of("fd00::2", 29400)`` is ``"[fd00::2]:29400"``.
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def find_moved(run_id: str, hosts: Sequence[str], port: int, *, timeout_s: float = 5.0) -> str | None:
    """The host of a store this run's rendezvous moved to, among ``hosts`` at ``port``.

    An agent that starts after a move (a replacement of the lost node, or a late joiner)
    was given the original endpoint; where a store that says it replaced it (:data:`MOVED_KEY`)
    answers on a candidate, it joins that one. A candidate that refuses or does not answer
    within ~1.5 s is passed over (at a job's start none listens: this costs nothing there).

    Args:
        run_id: the rendezvous id.
        hosts: the candidates, in order.
        port: the store's port.
        timeout_s: how long a store that answers may take to say what it is.

    Returns:
        The host, or ``None`` when the store did not move (or cannot be found).
    """
    from torch.distributed import TCPStore

    from torchstep.agent.liveness import ALIVE, probe

    key = MOVED_KEY.format(run_id=run_id)
    for host in hosts:
        if probe(host, port, 1.5) != ALIVE:
            continue
        try:
            store = TCPStore(host, port, None, False, timedelta(seconds=timeout_s), wait_for_workers=False)
            if store.check([key]):
                return host
        except Exception as e:  # another service on that port, or it went away: not ours
            log.info("no moved rendezvous store at %s:%d (%s: %s)", host, port, type(e).__name__, e)
    return None


def move(handler: Any, params: Any, *, host_addr: str, port: int, host_it: bool, timeout_s: float) -> str:
    """Rebuild ``handler`` on a new store at ``host_addr:port``, hosted here when ``host_it``.

    The handler object stays the one torch's agent holds (its loop keeps a reference to it);
    it takes the new handler's state, so its next rendezvous starts a new round on the new
    store (and is guarded and keeps its keep-alive tick like the first one).

    Args:
        handler: the agent's dynamic rendezvous handler (c10d).
        params: torch's ``RendezvousParameters`` of the run (the endpoint is replaced).
        host_addr: the successor's address (its node's).
        port: the store's port (the endpoint's).
        host_it: whether this agent is the successor.
        timeout_s: how long a client waits for the successor's store.

    Returns:
        The new endpoint (``host:port``).

    Raises:
        StoreMoveError: the store cannot be hosted or reached, or this torch lacks a name.
    """
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    from torchstep.agent.stores import host_store

    endpoint = endpoint_of(host_addr, port)
    timeout = timedelta(seconds=timeout_s)
    try:
        if host_it:
            store = host_store(host_addr, port, timeout=timeout)
            store.set(MOVED_KEY.format(run_id=params.run_id), str(params.endpoint))  # found by late agents
        else:
            store = TCPStore(host_addr, port, None, False, timeout, wait_for_workers=False)
    except Exception as e:  # a port taken here, or the successor never came (its agent died too)
        what = "host the rendezvous store" if host_it else "reach the rendezvous store"
        raise StoreMoveError(f"cannot {what} at {endpoint}: {type(e).__name__}: {e}") from None
    config = dict(params.config)
    config.pop("is_host", None)  # the store exists already: the handler only connects to it
    new_params = RendezvousParameters(
        backend=params.backend,
        endpoint=endpoint,
        run_id=params.run_id,
        min_nodes=params.min_nodes,
        max_nodes=params.max_nodes,
        local_addr=params.local_addr,
        **config,
    )
    from torchstep.agent.rdzv_guard import guard_handler

    new = create_handler(store, C10dRendezvousBackend(store, params.run_id), new_params)
    found = compat.rdzv_node_and_settings(handler)
    if found is not None:  # the keep-alive tick the agent gave the first handler
        compat.set_keep_alive(new, found[1].keep_alive_interval.total_seconds())
    if not compat.replace_rdzv_handler(handler, new):
        raise StoreMoveError("this torch's rendezvous handler cannot be rebuilt (torchstep.agent.compat)")
    guard_handler(handler, endpoint)  # a forged state in the new store is refused as in the first
    return endpoint
