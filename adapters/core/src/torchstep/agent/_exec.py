"""Exec wrapper the agent puts in front of every worker command (stdlib only, run with
``python -I -S``; it replaces itself with the worker, so the worker keeps its pid).

    python -I -S _exec.py --agent-pid PID [--merge-stderr] -- CMD [ARGS...]

Before ``exec`` it (1) asks the kernel to SIGKILL this process when the agent dies
(``PR_SET_PDEATHSIG``; the agent's reaper also kills the whole process group), and
(2) with ``--merge-stderr`` points stderr at stdout, so a rank's log file holds both
streams in the order they were written. This file must not import torchstep or torch.
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
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        sys.stderr.write(f"torchstep: cannot execute {cmd[0]!r}: {e}\n")
        os._exit(127 if isinstance(e, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1:])
