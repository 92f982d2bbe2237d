"""What a surface started for the whole campaign (a server, a deployment) is stopped by
:func:`close_all`: at the end of ``python -m tools.soak`` (atexit) and at the end of a pytest
session (the smoke's session fixture), where atexit handlers do not run (pytest-xdist's
workers end without them)."""

from __future__ import annotations

import atexit
import functools
from collections.abc import Callable
from typing import Any

_pending: list[Callable[[], None]] = []


def on_close(fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` when the campaign closes (once, last registered first).

    Args:
        fn: what stops the thing.
        *args: its arguments.
    """
    _pending.append(functools.partial(fn, *args))


def close_all() -> None:
    """Stop everything registered with :func:`on_close` (errors are printed, not raised)."""
    while _pending:
        fn = _pending.pop()
        try:
            fn()
        except Exception as e:  # one broken teardown must not keep the others running
            print(f"soak: teardown {fn} failed: {e!r}", flush=True)


atexit.register(close_all)
