"""Exec wrapper the agent puts in front of every worker command (stdlib only, run with
``python -I -S``; it replaces itself with the worker, so the worker keeps its pid).

    python -I -S _exec.py --agent-pid PID [--merge-stderr] -- CMD [ARGS...]

Before ``exec`` it (1) asks the kernel to SIGKILL this process when the agent dies
(``PR_SET_PDEATHSIG``; the agent's reaper also kills the whole process group), and
(2) with ``--merge-stderr`` points stderr at stdout, so a rank's log file holds both
streams in the order they were written. This file must not import torchstep or torch.

With the agent's worker zygote (``TORCHSTEP_ZYGOTE_SOCKET``: on by default) and a Python
worker (``python [-u] script.py ...`` or ``python [-u] -m module ...`` with this
interpreter), it does not exec: the zygote forks the worker with torch already imported
(``torchstep.agent.zygote``), this process forwards every signal it gets to the worker's
group and exits as the worker did. Anything else falls back to ``exec`` at once, without
waiting: another command, a zygote that is gone (its socket refuses the connection or no
longer exists: only the zygote holds the listening end) or that declines the worker.
"""

import os
import sys

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9


def _set_pdeathsig() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
    except Exception:  # not Linux: the reaper still kills the group
        pass


def main(argv: list[str]) -> None:
    """Parse the wrapper's options and ``exec`` the command (never returns).

    Example: ``main(["--agent-pid", "123", "--merge-stderr", "--", "python", "-u", "train.py"])``
    """
    agent_pid = 0
    merge = False
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--agent-pid":
            agent_pid = int(argv[i + 1])
            i += 1
        elif argv[i] == "--merge-stderr":
            merge = True
        i += 1
    cmd = argv[i + 1 :]
    if not cmd:
        sys.stderr.write("torchstep _exec: no command\n")
        os._exit(2)
    _set_pdeathsig()
    # the agent may have died between fork and prctl: then nobody would kill us
    if agent_pid and os.getppid() != agent_pid:
        os._exit(137)
    if merge:
        os.dup2(1, 2)
    zygote = os.environ.pop("TORCHSTEP_ZYGOTE_SOCKET", "")
    if zygote:
        request = python_request(cmd)
        if request is not None and _opens(request):
            _run_in_zygote(zygote, request)  # returns only when the zygote cannot be used
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"torchstep: cannot execute {cmd[0]!r}: {e}\n")
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


def same_python(command: str) -> bool:
    """Whether ``command`` (a path, or a name looked up in PATH) is this interpreter: the
    same binary in the same directory (a venv's ``python`` is not its base interpreter's)."""
    path = command
    if os.sep not in command:
        for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
            candidate = os.path.join(d or ".", command)
            if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
                path = candidate
                break
        else:
            return False
    try:
        here = os.path.abspath(sys.executable)
        there = os.path.abspath(path)
        return os.path.dirname(there) == os.path.dirname(here) and os.path.realpath(there) == os.path.realpath(here)
    except OSError:
        return False


def python_request(cmd: list) -> "dict | None":
    """What the zygote runs for ``cmd`` (this interpreter with only ``-u`` before a script
    or ``-m module``), or None: then the command is exec'd as usual."""
    if not same_python(cmd[0]):
        return None
    rest = cmd[1:]
    while rest and rest[0] == "-u":
        rest = rest[1:]
    if len(rest) >= 2 and rest[0] == "-m":
        return {"module": rest[1], "argv": rest[2:]}
    if rest and not rest[0].startswith("-"):
        return {"module": None, "argv": rest}
    return None


def _opens(request: dict) -> bool:
    """Whether the interpreter could open the request's script (a module: left to it). A
    script that cannot be opened is exec'd, so the worker ends exactly as ``python`` ends
    then: its "can't open file" line and exit status 2, not a traceback from the zygote."""
    if request["module"] is not None:
        return True
    try:
        with open(request["argv"][0], "rb"):
            return True
    except OSError:
        return False


def _run_in_zygote(path: str, request: dict) -> None:
    """Have the zygote fork the worker; never returns once it did (exits as the worker)."""
    import json  # here, not at the top: a wrapper without the zygote stays as cheap as before
    import signal
    import socket

    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        # one try: the agent bound the socket before any worker started, and only the zygote
        # holds it: refused (or gone) means the zygote is gone, for good
        conn.connect(path)
        payload = json.dumps({**request, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
        if len(payload) > 65536:  # a datagram: the send buffer must hold it whole
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, len(payload) + 65536)
        socket.send_fds(conn, [payload], [0, 1, 2])
        reply = conn.recv(4096).decode("utf-8", "replace")
    except OSError as e:
        why = "gone" if isinstance(e, (FileNotFoundError, ConnectionRefusedError, ConnectionResetError)) else e
        sys.stderr.write(f"torchstep: worker zygote not used ({why}); starting the worker directly\n")
        conn.close()
        return
    if not reply.startswith("pid ") or not reply[4:].isdigit():
        why = reply.partition(" ")[2] if reply.startswith("refused ") else "gone"
        sys.stderr.write(f"torchstep: worker zygote not used ({why}); starting the worker directly\n")
        conn.close()
        return
    pid = int(reply[4:])

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, forward)
    try:
        status = conn.recv(64).decode()
    except OSError:
        status = ""
    kind, _, value = status.partition(" ")
    if kind == "exit":
        os._exit(int(value))
    if kind == "signal":  # die the way the worker did
        signum = int(value)
        try:
            signal.signal(signum, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
            pass
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    # the zygote is gone (killed, or the agent is dying): the worker dies with it (its
    # PDEATHSIG); make sure, and say so where the worker's own output goes
    try:
        os.killpg(pid, _SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    sys.stderr.write("torchstep: the worker zygote died; the worker was killed with it\n")
    os._exit(137)


if __name__ == "__main__":
    main(sys.argv[1:])
