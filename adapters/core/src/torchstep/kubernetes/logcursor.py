"""Where a reader of a pod's log is, so a stream read again (a dropped connection, or a
watcher that died and was run again) continues without repeating or losing a line.

The API server's ``since_seconds`` has second resolution and overlaps; lines carry RFC 3339
timestamps (``timestamps=True``), several lines may share one, so a position is the newest
timestamp delivered and how many lines carried it.

    >>> c = Cursor()
    >>> c.accept("2026-11-24T10:00:00.5Z first"), c.accept("2026-11-24T10:00:00.5Z second")
    ('first', 'second')
    >>> again = Cursor.resumed(c.position())
    >>> again.accept("2026-11-24T10:00:00.5Z first"), again.accept("2026-11-24T10:00:01Z third")
    (None, 'third')
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any


class Cursor:
    """Where a pod's log stream is: the newest timestamp emitted and how many lines carried
    it, so a reattached stream (``since_seconds`` overlaps) skips what was already seen.

    A new cursor has seen nothing (:meth:`resumed` continues a saved one).
    """

    def __init__(self) -> None:
        self.last: str | None = None
        self.at_last = 0
        self.epoch: float | None = None
        self._skip_at_last = 0

    def accept(self, line: str) -> str | None:
        """Take one line of a stream read with ``timestamps=True``.

        Args:
            line: the line, its RFC 3339 timestamp first.

        Returns:
            The line without its timestamp, or ``None`` when it was already seen (a line
            without a timestamp is always new).
        """
        stamp, sep, text = line.partition(" ")
        key = _ts_key(stamp) if sep else None
        if key is None:  # no timestamp (the client did not add one): nothing to dedupe on
            return line
        if self.last is not None:
            if key < self.last:
                return None
            if key == self.last and self._skip_at_last > 0:
                self._skip_at_last -= 1
                return None
        if key == self.last:
            self.at_last += 1
        else:
            self.last, self.at_last = key, 1
            self.epoch = _epoch(stamp)
        return text

    def is_after(self, line: str) -> bool:
        """Whether ``line`` is newer than everything seen (a stream that starts with it may
        have missed lines in between); ``False`` before any line or without a timestamp.

        Args:
            line: a line with its timestamp first.
        """
        stamp, sep, _ = line.partition(" ")
        key = _ts_key(stamp) if sep else None
        return key is not None and self.last is not None and key > self.last

    def reattach(self) -> None:
        """A new stream starts (``since_seconds`` overlaps): skip the lines already seen
        at the last timestamp again."""
        self._skip_at_last = self.at_last

    @classmethod
    def resumed(cls, position: tuple[str, int] | None) -> Cursor:
        """A cursor continuing after ``position`` (saved by an earlier watcher).

        Args:
            position: ``(timestamp key, count)`` as :attr:`position` gave it; ``None``: a new cursor.
        """
        cursor = cls()
        if position is not None:
            cursor.last, cursor.at_last = position
            cursor.epoch = _epoch(position[0])
            cursor.reattach()
        return cursor

    def position(self) -> tuple[str, int] | None:
        """``(timestamp key, lines at it)`` to save; ``None`` before any timestamped line."""
        return None if self.last is None else (self.last, self.at_last)


def lines_of(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of a byte stream's chunks (a line may span chunks; the last may lack its newline).

    Args:
        chunks: the stream's chunks.

    Returns:
        The lines without their newlines.

    >>> list(lines_of([b"a\\nb", b"c\\nd"]))
    [b'a', b'bc', b'd']
    """
    buf = b""
    for chunk in chunks:
        buf += chunk
        *lines, buf = buf.split(b"\n")
        yield from lines
    if buf:
        yield buf


def cursor_value(value: Any) -> dict[str, tuple[str, int]]:
    """A saved cursor (a dict, or its JSON text) as ``{pod: (timestamp key, count)}``;
    anything malformed is ignored (the logs are then read from the start again).

    Args:
        value: what the store or the annotation held.

    Returns:
        Pod name → position (empty when nothing usable was saved).
    """
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    pods = value.get("pods") if isinstance(value, dict) else None
    out: dict[str, tuple[str, int]] = {}
    for name, pos in (pods or {}).items() if isinstance(pods, dict) else ():
        if (
            isinstance(name, str)
            and isinstance(pos, list | tuple)
            and len(pos) == 2
            and isinstance(pos[0], str)
            and _ts_key(pos[0] + "Z") is not None
            and isinstance(pos[1], int)
            and pos[1] >= 0
        ):
            out[name] = (pos[0], pos[1])
    return out


def _ts_key(stamp: str) -> str | None:
    """An RFC 3339 timestamp as a string that sorts in time order (nanoseconds padded)."""
    if len(stamp) < 20 or stamp[4] != "-" or stamp[10] != "T" or not stamp.endswith("Z"):
        return None
    head, _, frac = stamp[:-1].partition(".")
    return f"{head}.{frac.ljust(9, '0')[:9]}"


def _epoch(stamp: str) -> float | None:
    try:
        return datetime.fromisoformat(stamp[:19] + "+00:00").timestamp()
    except ValueError:
        return None
