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

A Python worker it execs gets the agent's stack handler even when its script never imports
torchstep: ``_site/`` beside this file goes first on its ``PYTHONPATH``, whose
``sitecustomize`` registers ``faulthandler`` for the stacks signal, puts ``PYTHONPATH`` and
``sys.path`` back as they were and runs the image's own ``sitecustomize``
(:func:`site_env`). Not for a command that is not Python (a shell script: the agent says "no
Python stack"), nor for ``python -I``/``-E``/``-S`` (they skip ``PYTHONPATH`` or ``site``:
the agent names the flag).
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
    os.environ.update(site_env(cmd, os.environ))
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"torchstep: cannot execute {cmd[0]!r}: {e}\n")
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


#: The directory whose ``sitecustomize`` gives an exec'd Python worker the stack handler.
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
#: What ``PYTHONPATH`` was before :func:`site_env` (``set:<value>`` or ``unset``): the
#: sitecustomize puts it back.
ORIGINAL_PYTHONPATH = "TORCHSTEP_SITE_PYTHONPATH"
#: Python options that take the next word (or the rest of their word) as their value.
_VALUE_OPTIONS = "WXQ"
_VALUE_LONG = ("--check-hash-based-pycs",)


def _which(command: str) -> "str | None":
    if os.sep in command:
        return command
    for d in os.environ.get("PATH", os.defpath).split(os.pathsep):
        candidate = os.path.join(d or ".", command)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def _is_python_name(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("python") and all(c.isdigit() or c == "." for c in name[6:])


def python_flags(argv: list) -> "list | None":
    """The isolating options (``-I``, ``-E``, ``-S``) of a Python command line, or None when
    ``argv`` is not one: its program is named ``python[X[.Y]]`` (itself or what it links
    to), or is a script whose ``#!`` line names one (then that line's options count).

    >>> python_flags(["python3", "-u", "train.py"])
    []
    >>> python_flags(["/usr/bin/python3.11", "-IS", "-c", "print(1)"])
    ['-I', '-S']
    >>> python_flags(["bash", "run.sh"]) is None
    True
    """
    path = _which(argv[0]) if argv else None
    if path is None:
        return None
    words = list(argv[1:])
    if not (_is_python_name(path) or _is_python_name(os.path.realpath(path))):
        try:
            with open(path, "rb") as f:
                first = f.read(256).split(b"\n", 1)[0]
        except OSError:
            return None
        if not first.startswith(b"#!"):
            return None
        shebang = first[2:].decode("utf-8", "replace").split()
        at = next((i for i, w in enumerate(shebang) if _is_python_name(w)), None)
        if at is None:
            return None
        words = shebang[at + 1 :]  # the script's own arguments come after the script: not options
    found = []
    i = 0
    while i < len(words):
        w = words[i]
        if w == "-" or not w.startswith("-") or w == "--":
            break
        if w.startswith("--"):
            i += 2 if w in _VALUE_LONG else 1
            continue
        letters = w[1:]
        for j, c in enumerate(letters):
            if c in "IES" and f"-{c}" not in found:
                found.append(f"-{c}")
            if c in "mc":  # the rest is the module or the command
                return found
            if c in _VALUE_OPTIONS:
                i += 0 if letters[j + 1 :] else 1  # the value is the rest of the word, or the next one
                break
        i += 1
    return found


def site_env(cmd: list, environ: "dict | os._Environ") -> dict:
    """The variables that give the Python worker ``cmd`` the stack handler when it is exec'd
    (nothing when the agent set no stacks file, ``cmd`` is not Python, or its Python skips
    ``PYTHONPATH`` or ``site``).

    Args:
        cmd: the worker's command line.
        environ: its environment.

    Returns:
        ``PYTHONPATH`` with :data:`SITE_DIR` first, and :data:`ORIGINAL_PYTHONPATH`.
    """
    if not environ.get("TORCHSTEP_STACKS_FILE") or not os.path.isdir(SITE_DIR):
        return {}
    flags = python_flags(cmd)
    if flags is None or flags:
        return {}
    original = environ.get("PYTHONPATH")
    return {
        "PYTHONPATH": SITE_DIR + (os.pathsep + original if original else ""),
        ORIGINAL_PYTHONPATH: "unset" if original is None else "set:" + original,
    }


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
