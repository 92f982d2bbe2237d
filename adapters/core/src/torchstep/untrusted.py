"""What a worker or a pod controls, read and shown safely: the one reader of the files a
worker writes (its outputs and error files, a replica's result file), the one JSON parser
for them and for a pod's termination message, the caps on every size, and the escaping of
text that leaves a rank's own log (a console, an orchestrator's log or page).

Standard library only: the agent, the worker API, the local supervisor, the Kubernetes
watcher and every adapter use it.

- :func:`read_capped` opens without following a symlink and without blocking (a FIFO), then
  requires a regular file no larger than the cap; it never raises for what the file is.
- :func:`parse_json` never raises: nesting deeper than :data:`MAX_JSON_DEPTH` is refused,
  and a non-finite number (``NaN``, ``Infinity``, ``1e999``) becomes the string ``"NaN"``,
  ``"Infinity"`` or ``"-Infinity"`` (:func:`json_safe`), each with a warning.
- :func:`escape_controls` and :func:`escape_control_bytes` make control characters visible
  (``ESC`` → ``\\x1b``); :func:`escape_markdown` makes text literal in Markdown.

Example::

    >>> parse_json(b'{"loss": NaN, "ok": 1}', what="outputs")
    ({'loss': 'NaN', 'ok': 1}, ['outputs.loss: NaN is not a JSON number; kept as the string "NaN"'])
    >>> parse_json(b"[" * 100 + b"]" * 100, what="outputs")[1]
    ['outputs: refused: nested deeper than 64 levels']
    >>> escape_controls("red \\x1b[31m bell \\x07")
    'red \\\\x1b[31m bell \\\\x07'
    >>> print(escape_markdown("[click](http://www.x.example)"))
    \\[click\\]\\(http\\://www\\.x\\.example\\)
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from typing import Any

__all__ = [
    "MAX_ERROR_FILE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_MESSAGE_CHARS",
    "MAX_OUTPUTS_BYTES",
    "MAX_RESULT_BYTES",
    "MAX_RESULT_READ_BYTES",
    "MAX_SUMMARY_READ_BYTES",
    "MAX_TAIL_LINE_BYTES",
    "MAX_TRACEBACK_CHARS",
    "cut",
    "escape_control_bytes",
    "escape_controls",
    "escape_markdown",
    "json_safe",
    "markdown_code",
    "parse_json",
    "read_capped",
    "read_json_file",
]

# -- the caps (docs/security.md "Caps and escaping" and docs/agent.md state them) ----------
#: JSON nested deeper than this (outputs, error files, results, termination messages) is refused.
MAX_JSON_DEPTH = 64
#: Rank 0's outputs file (``torchstep.output``): a larger one is refused with a warning.
MAX_OUTPUTS_BYTES = 1 << 20
#: A worker's error file (``torchstep.record`` / ``@record``): a larger one is refused.
MAX_ERROR_FILE_BYTES = 1 << 20
#: A result as written and published (result.json, an XCom, a KFP parameter): beyond it the
#: ranks' tails are cut, then the outputs dropped, each with a warning.
MAX_RESULT_BYTES = 4 << 20
#: A result file read back (the local supervisor reads each agent's): twice what is written.
MAX_RESULT_READ_BYTES = 2 * MAX_RESULT_BYTES
#: A termination message or result summary read back (Kubernetes keeps 4096 bytes).
MAX_SUMMARY_READ_BYTES = 64 << 10
#: One line of a rank's tail (the result keeps ``TAIL_LINES`` of them): longer ones are cut.
MAX_TAIL_LINE_BYTES = 2000
#: An error message from a worker's error file.
MAX_MESSAGE_CHARS = 4000
#: A traceback from a worker's error file.
MAX_TRACEBACK_CHARS = 64 << 10

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_MAX_NOTES = 10
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def read_capped(path: str | os.PathLike[str], max_bytes: int, *, what: str) -> tuple[bytes | None, str | None]:
    """The bytes of a file a worker controls: opened with ``O_NOFOLLOW`` and ``O_NONBLOCK``
    (a symlink is refused, a FIFO never blocks), then it must be a regular file of at most
    ``max_bytes``. Never raises for what is at ``path``.

    Args:
        path: the file.
        max_bytes: the most bytes it may hold.
        what: what the file is, for the warning (``"rank 0's outputs file"``).

    Returns:
        ``(data, None)``; ``(None, None)`` when there is no file; ``(None, warning)`` when it
        was refused or could not be read (``"<what> <path>: refused: is a symlink"``).

    Example::

        >>> read_capped("/nonexistent/outputs.json", 10, what="outputs file")
        (None, None)
    """
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | _NOFOLLOW | _NONBLOCK | _CLOEXEC)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return None, f"{what} {p}: refused: is a symlink (torchstep never follows one)"
        return None, f"{what} {p}: not read: {e.strerror or e}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, f"{what} {p}: refused: not a regular file"
        if st.st_size > max_bytes:
            return None, f"{what} {p}: refused: {st.st_size} bytes, over the cap of {max_bytes}"
        chunks: list[bytes] = []
        left = max_bytes + 1  # a file still growing is cut at the cap, never read whole
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
        if len(data) > max_bytes:
            return None, f"{what} {p}: refused: over the cap of {max_bytes} bytes"
        return data, None
    except OSError as e:
        return None, f"{what} {p}: not read: {e.strerror or e}"
    finally:
        os.close(fd)


def parse_json(data: bytes | str | None, *, what: str, max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, list[str]]:
    """JSON text from a worker or a pod, parsed so that nothing in it can raise: not JSON,
    not UTF-8 or nested deeper than ``max_depth`` gives ``None`` and a warning; non-finite
    numbers become strings (:func:`json_safe`), each with a warning.

    Args:
        data: the text (``None``: nothing to parse, no warning).
        what: what it is, for the warnings (``"outputs"``).
        max_depth: the deepest nesting accepted.

    Returns:
        ``(value, warnings)``; ``value`` is ``None`` when refused.

    Example::

        >>> parse_json("not json", what="error file")
        (None, ['error file: refused: not JSON (Expecting value at line 1 column 1)'])
    """
    if data is None:
        return None, []
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        value = json.loads(text, parse_constant=_constant)
    except RecursionError:
        return None, [f"{what}: refused: nested deeper than {max_depth} levels"]
    except UnicodeDecodeError:
        return None, [f"{what}: refused: not UTF-8 text"]
    except ValueError as e:
        why = f"{e.msg} at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
        return None, [f"{what}: refused: not JSON ({why})"]
    return json_safe(value, what=what, max_depth=max_depth)


def read_json_file(path: str | os.PathLike[str], max_bytes: int, *, what: str) -> tuple[Any, list[str]]:
    """:func:`read_capped` then :func:`parse_json`: the one way to read a JSON file a
    worker controls. Never raises.

    Args:
        path: the file.
        max_bytes: its cap.
        what: what it is, for the warnings.

    Returns:
        ``(value, warnings)``; ``value`` is ``None`` when there is no file or it was refused.
    """
    data, why = read_capped(path, max_bytes, what=what)
    if why is not None:
        return None, [why]
    return parse_json(data, what=f"{what} {os.fspath(path)}")


class _TooDeep(Exception):
    pass


def json_safe(value: Any, *, what: str = "value", max_depth: int = MAX_JSON_DEPTH) -> tuple[Any, list[str]]:
    """``value`` as data every JSON encoder and orchestrator accepts: a non-finite float
    becomes the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (one rule everywhere:
    result.json, XCom, KFP, Prefect), keys become strings, tuples lists, anything else its
    ``str``; nesting deeper than ``max_depth`` is refused. Never raises.

    Args:
        value: the data.
        what: its name, for the warnings (``"outputs"``: ``"outputs.acc: ..."``).
        max_depth: the deepest nesting accepted.

    Returns:
        ``(safe_value, warnings)``; ``safe_value`` is ``None`` when refused.

    Example::

        >>> json_safe({"acc": float("nan"), "ok": [1.5, float("-inf")]}, what="outputs")[0]
        {'acc': 'NaN', 'ok': [1.5, '-Infinity']}
    """
    notes: list[str] = []
    dropped = 0

    def note(path: str, text: str) -> None:
        nonlocal dropped
        if len(notes) < _MAX_NOTES:
            notes.append(f"{path}: {text}")
        else:
            dropped += 1

    def conv(v: Any, depth: int, path: str) -> Any:
        if v is None or isinstance(v, bool | int | str):
            return v
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            name = _NON_FINITE[repr(v)]
            note(path, f'{name} is not a JSON number; kept as the string "{name}"')
            return name
        if depth >= max_depth:
            raise _TooDeep
        if isinstance(v, dict):
            return {(k if isinstance(k, str) else str(k)): conv(x, depth + 1, f"{path}.{k}") for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [conv(x, depth + 1, f"{path}[{i}]") for i, x in enumerate(v)]
        return str(v)

    try:
        out = conv(value, 0, what)
    except (_TooDeep, RecursionError):
        return None, [f"{what}: refused: nested deeper than {max_depth} levels"]
    if dropped:
        notes.append(f"{what}: {dropped} more non-finite number(s) kept as strings")
    return out, notes


def _constant(name: str) -> float:
    return float(name)  # "NaN", "Infinity", "-Infinity": json_safe turns them into strings


def cut(text: str | None, max_chars: int) -> str | None:
    """``text`` cut to at most ``max_chars`` characters (``…`` and how much was cut at its end).

    Args:
        text: the text; ``None`` stays ``None``.
        max_chars: the most characters kept (the marker comes on top).

    Returns:
        The text, whole when short enough.

    Example::

        >>> cut("abcdef", 3)
        'abc… [3 more characters cut]'
    """
    if text is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}… [{len(text) - max_chars} more characters cut]"


# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides and
# isolates that reorder what a reader sees ("Trojan Source").
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_SAFE_ASCII = bytes([0x09, 0x0A, *range(0x20, 0x7F)])
_HIGH = bytes(range(0x80, 0x100))
_C1_BYTES = [(chr(c).encode(), f"\\x{c:02x}".encode()) for c in range(0x80, 0xA0)]
_BIDI_BYTES = [(chr(c).encode(), f"\\u{c:04x}".encode()) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))]


def _visible(ch: str) -> str:
    n = ord(ch)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}"


def escape_controls(text: str, *, newlines: bool = False) -> str:
    """``text`` with its control characters made visible (``ESC`` → ``\\x1b``, BEL, NUL,
    C1 controls, bidi overrides): what a worker printed can no longer clear a terminal,
    set its title, hide a link or reorder a line where it is shown outside the rank's log.

    Args:
        text: the text.
        newlines: also escape newlines (``\\x0a``) and tabs, for a one-line field.

    Returns:
        The escaped text (the same object when there was nothing to escape).

    Example::

        >>> escape_controls("a\\tb\\nc\\x1b]0;title\\x07")
        'a\\tb\\nc\\\\x1b]0;title\\\\x07'
    """
    if newlines:
        text = text.replace("\t", "\\x09").replace("\n", "\\x0a")
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub(lambda m: _visible(m.group()), text)


def escape_control_bytes(data: bytes) -> bytes:
    """:func:`escape_controls` for UTF-8 bytes (tabs and newlines kept), at C speed: one
    ``bytes.translate`` finds that there is nothing to escape (almost always), and each
    control present is replaced with one ``bytes.replace`` (a rank printing coloured logs
    costs the tee no Python work per line).

    Args:
        data: UTF-8 text as bytes.

    Returns:
        The escaped bytes.

    Example::

        >>> escape_control_bytes(b"\\x1b[2Jok\\n")
        b'\\\\x1b[2Jok\\n'
    """
    rest = data.translate(None, _SAFE_ASCII)  # what is neither printable ASCII, tab nor newline
    if not rest:
        return data
    c0 = rest.translate(None, _HIGH)  # a C0 byte or DEL is never part of a UTF-8 sequence
    for c in set(c0):
        data = data.replace(bytes([c]), b"\\x%02x" % c)
    if len(c0) != len(rest):
        if b"\xc2" in rest:  # the lead byte of every C1 control (U+0080..U+009F)
            for seq, shown in _C1_BYTES:
                if seq in data:
                    data = data.replace(seq, shown)
        if b"\xe2" in rest:  # ... and of the bidi overrides and isolates
            for seq, shown in _BIDI_BYTES:
                if seq in data:
                    data = data.replace(seq, shown)
    return data


# a dot before a letter inside a word (``evil.com``, ``train.py``) too: a fuzzy linkifier makes a link
# of a bare domain (a TLD starts with a letter, so ``0.7`` stays as it is)
_MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#!|<>~&:@])|(?<=\w)(\.)(?=[^\W\d_])")


def escape_markdown(text: str, *, max_chars: int | None = None) -> str:
    """``text`` as literal Markdown on one line: every character that could open or close
    a construct backslash-escaped (no link, image, emphasis, code span, HTML, entity,
    autolink or table cell can start or end inside it), control characters made visible,
    newlines as spaces.

    Args:
        text: the text.
        max_chars: cut the text to this many characters first (before escaping, so no
            escape is cut in half).

    Returns:
        The escaped text.

    Example::

        >>> print(escape_markdown("a`b|c ![x](h)"))
        a\\`b\\|c \\!\\[x\\]\\(h\\)
    """
    if max_chars is not None:
        text = cut(text, max_chars) or ""
    text = escape_controls(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " "))
    return _MD_PUNCT.sub(lambda m: "\\" + (m.group(1) or m.group(2)), text)


def markdown_code(text: str, *, max_chars: int | None = None) -> str:
    """``text`` as one Markdown code span, fenced by more backticks than any run inside it
    (a backtick in ``text`` cannot end the span), ``|`` escaped for a table cell, control
    characters made visible, newlines as spaces.

    Args:
        text: the text.
        max_chars: cut the text to this many characters first.

    Returns:
        The code span.

    Example::

        >>> print(markdown_code("a`b"), markdown_code("x|y"))
        ``a`b`` `x\\|y`
    """
    if max_chars is not None:
        text = cut(text, max_chars) or ""
    text = escape_controls(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")).replace("|", "\\|")
    fence = "`" * (max((len(run) for run in re.findall("`+", text)), default=0) + 1)
    pad = " " if text.startswith(("`", " ")) or text.endswith(("`", " ")) else ""
    return f"{fence}{pad}{text}{pad}{fence}"
