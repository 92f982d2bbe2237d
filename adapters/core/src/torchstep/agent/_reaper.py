"""The agent's reaper: a tiny process (stdlib only, ``python -I -S``) in its own session
that kills every worker process group when the agent dies, even by SIGKILL.

The agent writes one command per line to the reaper's stdin:

    g PGID    watch a worker's process group        ug PGID   forget it
    p PID     watch a single process                up PID    forget it
    done      the agent finished normally (it wrote its result)

At end of input — the agent exited or was killed, the kernel closes the pipe either way —
the reaper SIGKILLs what it still watches. Without ``done`` it also marks the result
files (``--result``) that still say RUNNING as FAILED ("agent killed"), and it removes the
agent's run directory (``--run-dir``). It runs isolated (``-I -S``): of torchstep it imports
only :mod:`torchstep.files` (stdlib only: the one atomic writer), from the installation it
belongs to, and never torch.
"""

import json
import os
import shutil
import signal
import sys
import time
import types


def _kill(groups: set, pids: set) -> int:
    n = 0
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n


def _mark_killed(path: str, killed: int) -> None:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return
    if data.get("state") != "RUNNING":
        return  # the agent wrote its final result
    msg = f"the agent died without writing a result (killed?); the reaper killed {killed} worker group(s)"
    now = time.time()
    data.update(state="FAILED", exit_code=137, message=msg, ended_at=now)
    if data.get("started_at"):
        data["duration_s"] = now - data["started_at"]
    for rep in data.get("replicas", []):
        rep.update(state="FAILED", exit_code=137, message=msg)
    _files().write_private(path, json.dumps(data, indent=2))


def _files() -> types.ModuleType:
    """:mod:`torchstep.files` of the torchstep this file belongs to (``-I`` left it off the path)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if root not in sys.path:
        sys.path.insert(0, root)
    import torchstep.files

    return torchstep.files


def main(argv: list) -> None:
    """Read commands until end of input, then kill what is watched.

    Example: ``main(["--result", "/out/result.json", "--run-dir", "/tmp/torchstep-run-x"])``
    """
    results = []
    run_dir = None
    i = 0
    while i < len(argv):
        if argv[i] == "--result":
            results.append(argv[i + 1])
        elif argv[i] == "--run-dir":
            run_dir = argv[i + 1]
        i += 2
    # a terminal's Ctrl-C or hang-up is for the agent, not for us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    groups: set = set()
    pids: set = set()
    done = False
    for raw in sys.stdin.buffer:
        parts = raw.decode("ascii", "replace").split()
        if not parts:
            continue
        cmd, arg = parts[0], (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0)
        if cmd == "g" and arg > 1:
            groups.add(arg)
        elif cmd == "ug":
            groups.discard(arg)
        elif cmd == "p" and arg > 1:
            pids.add(arg)
        elif cmd == "up":
            pids.discard(arg)
        elif cmd == "done":
            done = True
    killed = _kill(groups, pids)
    if not done:
        for path in results:
            try:
                _mark_killed(path, killed)
            except (OSError, ImportError):
                pass
    if run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
