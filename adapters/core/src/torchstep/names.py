"""Kubernetes-safe names derived deterministically from app and role names.

The run-unique suffix is *not* added here: it is added at run time (an orchestrator run id
or a fresh short id), never baked in at build/compile time.

Example::

    >>> dns_label("Trainer_Main")
    'trainer-main'
    >>> len(dns_label("x" * 100, max_len=40))
    40
    >>> run_name("trainer", "manual__2026-11-21T10:00:00+00:00")[:8]
    'trainer-'
"""

from __future__ import annotations

import hashlib
import re
import secrets

#: DNS-1123 label limit. Job names get pod names `<job>-<index>-<5 random>`, and the
#: Indexed Job adds the `batch.kubernetes.io/job-completion-index` label, so names used
#: for Jobs stay well below it (see ``JOB_NAME_MAX``).
LABEL_MAX = 63
#: Jobs: the Job controller appends ``-<index>-<5 chars>`` to pod names and the pod
#: hostname must stay a valid label.
JOB_NAME_MAX = 47

_INVALID = re.compile(r"[^a-z0-9-]+")


def _digest(text: str, n: int = 6) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def dns_label(name: str, *, max_len: int = LABEL_MAX) -> str:
    """A DNS-1123 label for ``name``: lowercase, ``[a-z0-9-]``, starts and ends
    alphanumeric, at most ``max_len`` characters.

    When characters had to be replaced or the name truncated, a short hash of the original
    name is appended so two different names cannot collide. Returns ``""`` when no
    ASCII letter or digit is left (callers raise a SpecError naming the field).
    """
    low = name.lower()
    cleaned = _INVALID.sub("-", low).strip("-")
    cleaned = re.sub(r"-{2,}", "-", cleaned)
    if not cleaned:
        return ""
    changed = cleaned != name
    if len(cleaned) <= max_len and not changed:
        return cleaned
    if not changed:  # only too long
        suffix = _digest(name)
        return f"{cleaned[: max_len - len(suffix) - 1].rstrip('-')}-{suffix}"
    suffix = _digest(name)
    head = cleaned[: max_len - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}" if head else suffix


def short_id(n: int = 6) -> str:
    """A fresh lowercase alphanumeric id (used for run-unique suffixes)."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


def run_name(base: str, run_id: str | None = None, *, max_len: int = JOB_NAME_MAX) -> str:
    """``base`` plus a run-unique suffix: a hash of ``run_id`` when given (stable for one
    orchestrator run/try), else a fresh random id.
    """
    suffix = _digest(run_id, 8) if run_id else short_id(8)
    head = base[: max_len - len(suffix) - 1].rstrip("-")
    return f"{head}-{suffix}"


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def is_env_name(name: str) -> bool:
    """True for a portable environment variable name (POSIX / Kubernetes C_IDENTIFIER)."""
    return bool(_ENV_NAME.match(name))
