"""What a role's command line says about torchrun (read, never rewritten).

TorchX's ``dist.ddp`` roles run ``bash -c "torchrun ..."``; hand-written roles may call
``torchrun`` or ``python -m torch.distributed.run`` directly. Under torchstep such a role
keeps its argv: the ``torchrun`` shim first on PATH runs it as the embedded agent. The
planner still has to know the flags that decide process counts and restarts, to check
them against the AppDef (a ``--nnodes`` that disagrees with ``num_replicas`` would make
the rendezvous wait forever).

Example::

    >>> call = parse_torchrun("bash", ["-c", "cd /w && torchrun --nnodes=2 --nproc-per-node 4 train.py --lr 1"])
    >>> (call.nnodes, call.nproc_per_node, call.max_restarts)
    ('2', '4', None)
    >>> parse_torchrun("bash", ["-c", "echo torchrun"]) is None
    True
"""

from __future__ import annotations

import functools
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

#: Executables that are torchrun under torchstep (the shim execs the agent).
TORCHRUN_NAMES = ("torchrun", "torchstep-agent")
_SHELLS = ("bash", "sh", "dash", "zsh")
# torchrun flags that take no value (every other flag consumes the next word)
_BOOL_FLAGS = frozenset(
    {
        "--standalone",
        "-m",
        "--module",
        "--no-python",
        "--no_python",
        "--run-path",
        "--run_path",
        "--virtual-local-rank",
        "--virtual_local_rank",
    }
)
_FLAGS = {
    "--nnodes": "nnodes",
    "--nproc-per-node": "nproc_per_node",
    "--nproc_per_node": "nproc_per_node",
    "--max-restarts": "max_restarts",
    "--max_restarts": "max_restarts",
}
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "{", "}", "\n"})
_PREFIXES = frozenset({"exec", "env", "time", "nohup", "then", "do", "else", "!"})


@dataclass(frozen=True)
class TorchrunCall:
    """The torchrun flags of a role's command that the planner checks (raw strings).

    Args:
        nnodes: ``--nnodes`` as written; ``None``: not given.
        nproc_per_node: ``--nproc-per-node`` as written; ``None``: not given.
        max_restarts: ``--max-restarts`` as written; ``None``: not given.
    """

    nnodes: str | None = None
    nproc_per_node: str | None = None
    max_restarts: str | None = None


def _shell_words(script: str) -> list[str] | None:
    words = _split(script)
    return None if words is None else list(words)


@functools.lru_cache(maxsize=512)
def _split(script: str) -> tuple[str, ...] | None:
    # cached: a DAG of 50 dist.ddp operators splits the same torchrun script 50 times per parse
    lex = shlex.shlex(script, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        return tuple(lex)
    except ValueError:  # unbalanced quotes: not ours to judge, the shell will complain
        return None


def _invocation(words: Sequence[str]) -> list[str] | None:
    """The words after the first torchrun in command position, up to the next separator."""
    at_command = True
    for i, w in enumerate(words):
        if w in _SEPARATORS or (w and set(w) <= set(";&|()")):
            at_command = True
            continue
        if not at_command:
            continue
        if w in _PREFIXES or ("=" in w and not w.startswith("-") and w.split("=", 1)[0].isidentifier()):
            continue  # `exec torchrun`, `FOO=1 torchrun`
        if os.path.basename(w) in TORCHRUN_NAMES:
            rest: list[str] = []
            for x in words[i + 1 :]:
                if x in _SEPARATORS or (x and set(x) <= set(";&|()")):
                    break
                rest.append(x)
            return rest
        at_command = False
    return None


def script_index(entrypoint: str, args: Sequence[str]) -> int | None:
    """The index in ``args`` of the code a shell or Python interpreter evaluates
    (``bash -c SCRIPT``, ``sh -ec SCRIPT``, ``python -c CODE``), or ``None``.

    Args:
        entrypoint: the role's entrypoint (``bash``, ``python``, ``torchrun``...).
        args: the role's arguments.

    >>> script_index("bash", ["-ec", "echo hi"]), script_index("/usr/bin/python3", ["-c", "print(1)"])
    (1, 1)
    >>> script_index("python", ["train.py", "-c", "x"]) is None
    True
    """
    exe = os.path.basename(entrypoint)
    if exe in _SHELLS:
        for j, a in enumerate(args[:-1]):
            if a == "-c" or (a.startswith("-") and not a.startswith("--") and a.endswith("c")):
                return j + 1
            if not a.startswith("-"):
                return None
        return None
    if exe.startswith("python"):
        for j, a in enumerate(args[:-1]):
            if a == "-c":
                return j + 1
            if not a.startswith("-") or a == "-m":
                return None
    return None


def torchrun_words(entrypoint: str, args: Sequence[str]) -> list[str] | None:
    """The arguments of the role's own torchrun, or ``None`` when it runs none.

    Args:
        entrypoint: the role's entrypoint (``bash``, ``python``, ``torchrun``...).
        args: the role's arguments.

    Returns:
        The words after ``torchrun`` (split as a shell would, in a script), or ``None``.
    """
    exe = os.path.basename(entrypoint)
    if exe in TORCHRUN_NAMES:
        return list(args)
    if exe in _SHELLS:
        for j, a in enumerate(args[:-1]):
            if a == "-c" or (a.startswith("-") and not a.startswith("--") and a.endswith("c")):
                words = _shell_words(args[j + 1])
                return _invocation(words) if words is not None else None
        return None
    if exe.startswith("python") and len(args) >= 2 and args[0] == "-m" and args[1] == "torch.distributed.run":
        return list(args[2:])
    return None


def parse_torchrun(entrypoint: str, args: Sequence[str]) -> TorchrunCall | None:
    """The checked flags of the role's own torchrun, or ``None`` when it runs none.
    Parsing stops at the script: the script's own ``--nnodes`` is not torchrun's.

    Args:
        entrypoint: the role's entrypoint (``bash``, ``python``, ``torchrun``...).
        args: the role's arguments.

    Returns:
        The flags, or ``None``.
    """
    words = torchrun_words(entrypoint, args)
    if words is None:
        return None
    found: dict[str, str] = {}
    it = iter(words)
    for w in it:
        if not w.startswith("-"):
            break  # the script (or module) name: the rest are its own args
        flag, eq, value = w.partition("=")
        if not eq and flag not in _BOOL_FLAGS:
            value = next(it, "")
        if flag in _FLAGS:
            found[_FLAGS[flag]] = value
        if flag in ("-m", "--module"):
            break
    return TorchrunCall(**found)


def detect_torchrun(entrypoint: str, args: Sequence[str]) -> tuple[bool, int | None]:
    """Whether the role runs its own torchrun (TorchX ``dist.ddp`` style), and its
    ``--nproc-per-node`` when it is a plain number.

    Args:
        entrypoint: the role's entrypoint (``bash``, ``python``, ``torchrun``...).
        args: the role's arguments.

    Returns:
        ``(runs torchrun, nproc per node or None)``.

    >>> detect_torchrun("bash", ["-c", "torchrun --nnodes 1 --nproc_per_node 2 train.py"])
    (True, 2)
    >>> detect_torchrun("python", ["train.py"])
    (False, None)
    """
    call = parse_torchrun(entrypoint, args)
    if call is None:
        return False, None
    return True, positive_int(call.nproc_per_node)


def positive_int(text: str | None, limit: int = 4096) -> int | None:
    """``text`` as an int in 1..limit, else ``None`` (``"gpu"``, ``"auto"``, macros...).

    Args:
        text: the flag's value as written.
        limit: the largest value accepted.
    """
    if text is None or not text.isascii() or not text.isdigit():
        return None
    n = int(text)
    return n if 0 < n <= limit else None


def split_component_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """A CLI's ``[opts..., "--", component args...]`` → ``(opts, component args)``.

    Args:
        argv: the command line after the program name.

    >>> split_component_args(["--target", "kfp", "--", "--lr", "0.1"])
    (['--target', 'kfp'], ['--lr', '0.1'])
    """
    argv = list(argv)
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []
