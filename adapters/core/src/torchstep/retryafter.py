"""The ``Retry-After`` header, read once for every HTTP client of torchstep (the REST
schedulers' and the Kubernetes API's retries).

Example::

    >>> from torchstep.retryafter import seconds
    >>> seconds("2"), seconds("Wed, 21 Oct 2015 07:28:00 GMT"), seconds("soon")
    (2.0, 0.0, None)
"""

from __future__ import annotations

import email.utils
import math
import time


def seconds(value: str | None) -> float | None:
    """Seconds of a ``Retry-After`` header (a number or an HTTP date), ``None`` if absent or
    unreadable.

    Args:
        value: the header's value.

    Returns:
        Seconds to wait (never negative), or ``None``.
    """
    if not value:
        return None
    try:
        secs = float(value)
    except ValueError:
        try:
            secs = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return max(0.0, secs) if math.isfinite(secs) else None
