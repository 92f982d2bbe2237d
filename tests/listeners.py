"""What a test needs to check who can reach a run's sockets: the TCP sockets a set of
processes listens on (from /proc, no tools), and an address of this machine that is not
loopback (what a stranger on another machine would dial)."""

from __future__ import annotations

import os
import socket


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (by parent pid, whatever their sessions)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    found, todo = {root}, [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                todo.append(child)
    return found


def listening(pids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of ``pids`` holds."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            pass
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[3] != "0A" or cols[9] not in inodes:
                    continue
                hexaddr, hexport = cols[1].split(":")
                if width == 8:
                    addr = socket.inet_ntop(socket.AF_INET, bytes.fromhex(hexaddr)[::-1])
                else:
                    words = [bytes.fromhex(hexaddr[i : i + 8])[::-1] for i in range(0, 32, 8)]
                    addr = socket.inet_ntop(socket.AF_INET6, b"".join(words))
                found.add((addr, int(hexport, 16)))
    return found


def external_ip() -> str | None:
    """An address of this machine that is not loopback (what another machine would dial)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # no packet is sent: only the route is looked up
            ip = str(s.getsockname()[0])
        except OSError:
            return None
    return None if ip.startswith("127.") else ip
