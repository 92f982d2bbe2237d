"""The rules a TorchX scheduler checks on submit and a record is checked against again on
reading, written once (``base`` and ``records`` both import this module; it imports
nothing of torchstep).

Example::

    >>> url_problem("https://ada:hunter2@kfp.example.com") is not None
    True
    >>> url_problem("http://127.0.0.1:8080") is None
    True
    >>> bool(SECRET_VAR.fullmatch("AIRFLOW_API_TOKEN")), bool(SECRET_VAR.fullmatch("ghp_0123abcd"))
    (True, False)
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

#: The one rule for the name of a variable holding a credential: upper case, as POSIX names
#: the variables of the environment. A secret pasted in its place (``ghp_...``, ``pnu_...``,
#: a JWT) has lower-case letters or dots and is refused without being repeated.
SECRET_VAR = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")

#: The options (and record keys) whose value names a variable holding a credential, in
#: every scheduler: the scheduler sends that variable's value to the recorded endpoint.
CREDENTIAL_VARS = frozenset({"token_env", "password_env", "api_key_env", "auth_string_env"})


def url_problem(value: Any) -> str | None:
    """Why ``value`` is not an endpoint a scheduler accepts (``None``: it is one): an
    http(s) URL with a host and without credentials, query, fragment or whitespace. The
    answer never repeats the value (it may hold a password).

    Args:
        value: the endpoint as given or as read from a record.

    Returns:
        ``None``, or the problem as a phrase to follow the field's name.
    """
    if not isinstance(value, str) or any(c.isspace() for c in value):
        return "is not an http(s) URL (not shown)"
    try:
        parts = urlsplit(value)
        host = parts.hostname
        has_auth = bool(parts.username or parts.password)
    except ValueError:  # "http://[::1" and the like
        return "is not an http(s) URL (not shown)"
    if has_auth or parts.query or parts.fragment:
        return "must be an http(s) URL with no credentials, query or fragment (a URL with credentials, not shown)"
    if parts.scheme not in ("http", "https") or not host:
        return "is not an http(s) URL (not shown)"
    return None
