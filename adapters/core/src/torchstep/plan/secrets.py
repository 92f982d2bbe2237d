"""Plain ``env`` values that look like secrets: the one rule behind the warning that a
token, secret, password or key is about to be written by value into a compiled KFP
pipeline, rendered Kubernetes objects or Airflow's rendered fields (and ``explain``).

A name looks like a secret when it matches ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*`` or
``*_KEY`` in any case (``TOKENIZERS_*``, a Hugging Face switch, does not). The fix is
``role.metadata["torchstep"]["secret_env"]``: a Kubernetes Secret, by reference.

Example::

    >>> looks_like_secret("HF_TOKEN"), looks_like_secret("wandb_api_key"), looks_like_secret("TOKENIZERS_PARALLELISM")
    (True, True, False)
    >>> print(inlined_secrets_note([(0, {"HF_TOKEN": "hf_abc", "LOGLEVEL": "INFO"})], "the compiled pipeline"))
    roles[0].env['HF_TOKEN'] looks like a secret and is written by value into the compiled pipeline; fix: \
role.metadata['torchstep']['secret_env'] = {'HF_TOKEN': '<secret-name>/<key>'} (a Kubernetes Secret, by reference)
"""

from __future__ import annotations

import fnmatch
import threading
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "INLINED_INTO",
    "SECRET_NAME_PATTERNS",
    "InlinedSecretWarning",
    "inlined_secrets_note",
    "looks_like_secret",
    "warn_inlined",
    "warn_note",
]

#: Names that look like secrets (matched in upper case).
SECRET_NAME_PATTERNS = ("*TOKEN*", "*SECRET*", "*PASSWORD*", "*_KEY")
#: Names that match a pattern but are known switches, not secrets.
NOT_SECRETS = ("TOKENIZERS_*",)

#: Where a role's plain env values are written on each target (besides the processes' env).
INLINED_INTO = {
    "local": "the AppDef (a DAG-run conf or flow-run parameters when it is sent to a scheduler)",
    "kubernetes": "the rendered Kubernetes objects (and Airflow's rendered fields of the task)",
    "kfp": "the compiled pipeline",
}

#: How many steps' notes a process remembers (not to say one twice) before it forgets them all.
_REMEMBERED = 1024
_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


class InlinedSecretWarning(UserWarning):
    """A plain ``env`` value that looks like a secret is written by value where others can read it."""


def looks_like_secret(name: str) -> bool:
    """Whether the environment variable ``name`` looks like it holds a secret.

    Args:
        name: an environment variable name.

    Returns:
        True for ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*_KEY`` (any case) but ``TOKENIZERS_*``.
    """
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, p) for p in SECRET_NAME_PATTERNS) and not any(
        fnmatch.fnmatchcase(upper, p) for p in NOT_SECRETS
    )


def inlined_secrets_note(roles: Iterable[tuple[int, Any]], where: str) -> str | None:
    """One line naming every secret-looking, non-empty ``env`` value of ``roles``, what it
    is written into and the fix.

    Args:
        roles: pairs of a role's index and its ``env`` mapping.
        where: what the values are written into (``the compiled pipeline``).

    Returns:
        The line, or ``None`` when there is nothing to say. It never holds a value.
    """
    fields = [
        f"roles[{i}].env[{name!r}]"
        for i, env in roles
        for name, value in (env.items() if isinstance(env, Mapping) else ())
        if isinstance(name, str) and value not in ("", None) and looks_like_secret(name)
    ]
    if not fields:
        return None
    first = fields[0].split("'")[1]
    what = (
        f"{fields[0]} looks like a secret and is"
        if len(fields) == 1
        else f"{', '.join(fields)} look like secrets and are"
    )
    return (
        f"{what} written by value into {where}; fix: role.metadata['torchstep']['secret_env'] = "
        f"{{{first!r}: '<secret-name>/<key>'}} (a Kubernetes Secret, by reference)"
    )


def warn_inlined(plan: Any, where: str) -> str | None:
    """Warn (:class:`InlinedSecretWarning`) once per step and ``where`` in this process when
    ``plan`` inlines secret-looking env values there.

    Args:
        plan: a :class:`~torchstep.StepPlan`.
        where: what its env values are written into (:data:`INLINED_INTO`).

    Returns:
        The note (:func:`inlined_secrets_note`), or ``None``.
    """
    note = inlined_secrets_note([(r.index, r.env) for r in plan.roles], where)
    if note is not None:
        warn_note(note, plan.app_name, stacklevel=4)
    return note


def warn_note(note: str, app_name: str, *, stacklevel: int = 3) -> None:
    """Warn (:class:`InlinedSecretWarning`) with a note :func:`warn_inlined` made, once per
    step in this process: for an outcome kept without its plan
    (:mod:`torchstep.components.plan_store`).

    Args:
        note: what :func:`inlined_secrets_note` returned.
        app_name: the app the note is about.
        stacklevel: passed to ``warnings.warn``.
    """
    with _lock:
        if (note, app_name) in _warned:
            return
        if len(_warned) >= _REMEMBERED:  # a long-lived process (a served flow) sees many steps
            _warned.clear()
        _warned.add((note, app_name))
    warnings.warn(f"torchstep: app {app_name!r}: {note}", InlinedSecretWarning, stacklevel=stacklevel)
