"""Stores that only this machine can reach, when nothing but this machine needs them.

torch's ``TCPStore`` server listens on every interface whatever host name it is given (checked
on torch 2.6, 2.13 and 2.15 with ``ss -ltn``), and it has no authentication. A store only the
run's own processes on one machine use — the rendezvous store of a one-node rendezvous the
agent hosts itself (``--standalone``, torchrun's single-node default), and the workers' store
when its address is a loopback address — is therefore bound here to loopback first and handed
to torch as an already listening socket (``master_listen_fd``).

Example (what the runner and the agent do)::

    params = private_params(params)                 # local_addr 127.0.0.1 for a one-node rendezvous
    handler = private_handler(params) or registry.get_rendezvous_handler(params)
    store = host_store("127.0.0.1", 29400)          # the workers' store, loopback only
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Collection
from datetime import timedelta
from typing import Any

from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

__all__ = ["LOOPBACK", "host_store", "loopback_ip", "private_handler", "private_params", "shutdown_connections"]

log = logging.getLogger("torchstep.agent")

#: The address a one-machine store is bound to.
LOOPBACK = "127.0.0.1"


def loopback_ip(host: str | None) -> str | None:
    """The IPv4 loopback address ``host`` stands for, if it is one.

    Args:
        host: a host name or address (``localhost``, ``127.0.0.1``, a name in /etc/hosts).

    Returns:
        The address (e.g. ``"127.0.0.1"``), or ``None`` when ``host`` is not (only) loopback.
    """
    if not host:
        return None
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return None
    addrs = {str(info[4][0]) for info in infos}
    if len(addrs) == 1 and ipaddress.ip_address(next(iter(addrs))).is_loopback:
        return addrs.pop()
    return None


def host_store(addr: str, port: int, *, timeout: timedelta = timedelta(seconds=300), multi_tenant: bool = True) -> Any:
    """A master ``TCPStore`` on ``port`` that listens on loopback only when ``addr`` is a
    loopback address, else on every interface (torch's own behaviour).

    Args:
        addr: the address its clients connect to.
        port: its port (0: a free one; read it from ``store.port``).
        timeout: the store's timeout.
        multi_tenant: torch's ``multi_tenant`` (several stores of one process share the server).

    Returns:
        The store.

    Raises:
        OSError: the address cannot be bound.
        RuntimeError: torch cannot serve the store.
    """
    from torch.distributed import TCPStore

    ip = loopback_ip(addr)
    if ip is None:
        return TCPStore(addr, port, None, True, timeout, wait_for_workers=False, multi_tenant=multi_tenant)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own server does
        sock.bind((ip, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    port = sock.getsockname()[1]
    fd = sock.detach()  # the store's from now on
    kwargs: dict[str, Any] = {"wait_for_workers": False, "multi_tenant": multi_tenant, "master_listen_fd": fd}
    try:
        try:
            return TCPStore(ip, port, None, True, timeout, use_libuv=_libuv_takes_listen_fd(), **kwargs)
        except NotImplementedError:  # libuv takes no listening socket here; the legacy server does
            return TCPStore(ip, port, None, True, timeout, use_libuv=False, **kwargs)
    except BaseException:
        socket.close(fd)
        raise


def _libuv_takes_listen_fd() -> bool:
    """Whether torch's libuv store server accepts ``master_listen_fd``: not on 2.4 and 2.6
    (``NotImplementedError``, after an error line on stderr), yes on 2.11 and later (checked);
    the legacy server takes it on every version checked (2.4, 2.6, 2.11, 2.13, 2.15)."""
    import torch

    try:
        major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 11)


def private_params(params: Any) -> Any:
    """The rendezvous parameters with ``local_addr`` set to loopback for a rendezvous no other
    node can join (:func:`is_private`), so that the workers' store address is loopback too.

    Args:
        params: torch's ``RendezvousParameters``.

    Returns:
        ``params``, changed in place where that applies.
    """
    if is_private(params) and not params.local_addr:
        params.local_addr = LOOPBACK
    return params


def is_private(params: Any) -> bool:
    """Whether a rendezvous is this agent's alone: c10d over TCP, one node at most, hosted by
    this agent on a port it picks itself (``host:0``) or on a loopback endpoint
    (``localhost:29500``, a one-replica pod's).

    Args:
        params: torch's ``RendezvousParameters``.

    Returns:
        ``True`` for such a rendezvous.
    """
    try:  # as the c10d handler reads it: "localhost" alone is localhost:29400
        host, port = parse_rendezvous_endpoint(str(params.endpoint or "").strip(), default_port=29400)
    except ValueError:
        return False  # torch's handler refuses it with its own message
    return (
        params.backend == "c10d"
        and params.max_nodes == 1
        and (port == 0 or loopback_ip(host) is not None)
        and str(params.config.get("store_type", "tcp")).strip().lower() == "tcp"
        and params.get_as_bool("is_host") is not False
    )


def private_handler(params: Any) -> Any:
    """A c10d rendezvous handler whose store listens on loopback only, for a rendezvous no
    other node can join (torch's own would listen on every interface).

    Args:
        params: torch's ``RendezvousParameters``.

    Returns:
        The handler, or ``None`` when the rendezvous is not private or its port is taken (use
        torch's registry: it joins the store there as a client, as torchrun does).
    """
    if not is_private(params):
        return None
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    read_timeout = params.get_as_int("read_timeout", 60)
    port = int(str(params.endpoint).rpartition(":")[2])
    try:
        store = host_store(LOOPBACK, port, timeout=timedelta(seconds=read_timeout))
    except OSError as e:
        log.info("the rendezvous port %d is taken (%s): joining the store there", port, e)
        return None
    backend = C10dRendezvousBackend(store, params.run_id)
    return create_handler(store, backend, params)


def shutdown_connections(host: str, port: int, addresses: Collection[str] = ()) -> int:
    """Shut down every TCP connection of this process to ``host:port`` (both directions).

    torch's store client has no deadline on most calls (a ``compare_set`` to a store host that
    stopped answering blocks until TCP gives up, ~15 minutes); a call blocked on a shut-down
    socket fails at once. The agent does this when it knows the store is out of reach
    (:mod:`torchstep.agent.liveness`), so its main loop ends instead of hanging. The sockets
    themselves stay open (their owner closes them); only this process's are found, through
    ``/proc/self/fd``.

    Args:
        host: the store's host name or address.
        port: its port.
        addresses: ``host``'s addresses, looked up earlier: then nothing is looked up now (a
            node cut off from the network is often cut off from its DNS server too, where a
            lookup waits for the resolver's timeouts, ~10 s, and fails).

    Returns:
        How many connections were shut down.
    """
    import os

    addrs = set(addresses)
    if not addrs:
        try:
            addrs = {str(info[4][0]) for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)}
        except OSError:
            return 0
    count = 0
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            dup = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if dup.type != socket.SOCK_STREAM or dup.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            peer = dup.getpeername()
            host_ip = str(peer[0]).removeprefix("::ffff:")  # torch's client may be IPv6, v4-mapped
            if host_ip in addrs and int(peer[1]) == port:
                dup.shutdown(socket.SHUT_RDWR)
                count += 1
        except OSError:
            pass  # not connected, or gone meanwhile
        finally:
            dup.close()  # the duplicate only: the connection's owner still holds its own fd
    return count
