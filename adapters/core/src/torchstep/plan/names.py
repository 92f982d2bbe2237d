"""Every name rule of torchstep in one place: Kubernetes-safe names derived
deterministically from app and role names, and the syntax checks of names and values
(the API server's own rules, checked while planning so a bad name is a SpecError naming
the field, not a rejected ``kubectl apply``): DNS-1123 labels and subdomains, label
values, qualified names, quantities, port names, extended resources, environment
variable names.

The run-unique suffix is *not* added here at build time: :func:`run_name` adds it at run
time (a hash of the orchestrator's run id, or a fresh short id), so a plan, a rendered
manifest or a compiled pipeline never carries one run's name.

Example::

    >>> dns_label("Trainer_Main")
    'trainer-main'
    >>> len(dns_label("x" * 100, max_len=40))
    40
    >>> run_name("trainer", "manual__2026-11-21T10:00:00+00:00")
    'trainer-c6288252'
    >>> is_label_value("p4d.24xlarge"), is_label_value("-x")
    (True, False)
    >>> is_qualified_name("kueue.x-k8s.io/queue-name"), is_quantity("8Gi"), is_quantity("8 GB")
    (True, True, False)
"""

from __future__ import annotations

import hashlib
import re
import secrets

#: DNS-1123 label limit.
LABEL_MAX = 63
#: Jobs: the Job controller appends ``-<index>-<5 chars>`` to pod names and the pod
#: hostname must stay a valid label, so Job names stay at or below this.
JOB_NAME_MAX = 47

_INVALID = re.compile(r"[^a-z0-9-]+")
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
#: Airflow's rule for a DAG or task id (``airflow.utils.helpers.KEY_REGEX``, at most 250 characters).
_AIRFLOW_ID = re.compile(r"[\w.-]{1,250}", re.ASCII)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# resource.Quantity: a decimal number with an optional binary/decimal SI suffix or exponent
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")
# IANA_SVC_NAME: at most 15 characters [a-z0-9-], at least one letter, no leading/trailing '-'
_PORT_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$")
_EXTENDED_RESOURCE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def _digest(text: str, n: int = 6) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:n]


def is_dns_label(name: str, *, max_len: int = LABEL_MAX) -> bool:
    """True when ``name`` is a valid DNS-1123 label of at most ``max_len`` characters.

    Args:
        name: the name to check.
        max_len: the most characters allowed (63 for a label).

    >>> is_dns_label("trainer-0"), is_dns_label("Trainer"), is_dns_label("-a")
    (True, False, False)
    """
    return len(name) <= max_len and bool(_LABEL.match(name))


def is_dns_subdomain(name: str) -> bool:
    """True when ``name`` is a DNS-1123 subdomain (names of Secrets, PVCs...).

    Args:
        name: the name to check.

    >>> is_dns_subdomain("hf-token.v2"), is_dns_subdomain("HF_token")
    (True, False)
    """
    return len(name) <= 253 and bool(_SUBDOMAIN.match(name))


def dns_label(name: str, *, max_len: int = LABEL_MAX) -> str:
    """A DNS-1123 label for ``name``: lowercase, ``[a-z0-9-]``, starts and ends
    alphanumeric, at most ``max_len`` characters, always the same for the same name.

    Invalid characters become ``-`` (``Trainer_Main`` → ``trainer-main``). A name that is
    too long is cut and gets a short hash of the whole name, so two long names sharing a
    prefix stay distinct. Two names that differ only in case or punctuation map to the
    same label: the planner rejects that within one app. Returns ``""`` when no ASCII
    letter or digit is left (callers raise a SpecError naming the field).

    Args:
        name: any name (an AppDef's, a role's).
        max_len: the most characters of the label.

    Returns:
        The label, or ``""``.

    >>> dns_label("a" * 70) == dns_label("a" * 71)
    False
    >>> dns_label("模型")
    ''
    """
    cleaned = re.sub(r"-{2,}", "-", _INVALID.sub("-", name.lower())).strip("-")
    if not cleaned:
        return ""
    if len(cleaned) <= max_len:
        return cleaned
    suffix = _digest(name)
    head = cleaned[: max(max_len - len(suffix) - 1, 0)].rstrip("-")
    return f"{head}-{suffix}" if head else suffix[:max_len]


def short_id(n: int = 6) -> str:
    """A fresh lowercase alphanumeric id (used for run-unique suffixes).

    Args:
        n: its length in characters.
    """
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(secrets.choice(alphabet) for _ in range(n))


def run_name(base: str, run_id: str | None = None, *, max_len: int = JOB_NAME_MAX) -> str:
    """``base`` (a DNS label, e.g. ``f"{plan.k8s_name}-{role.k8s_name}"``) plus a
    run-unique suffix: a hash of ``run_id`` when given (stable across the retries of one
    orchestrator run), else a fresh random id. Call it at run time, never at build time.

    ``base`` is shortened deterministically (with a hash of the whole base) when the
    result would exceed ``max_len``, so two long bases sharing a prefix never collide.

    Args:
        base: the name's DNS-label prefix.
        run_id: the orchestrator's run id; ``None``: a fresh random suffix.
        max_len: the most characters of the result.

    Returns:
        A DNS label of at most ``max_len`` characters.

    >>> a = run_name("x" * 60 + "-trainer", "run-1")
    >>> b = run_name("x" * 60 + "-reader", "run-1")
    >>> a != b and len(a) == 47 and is_dns_label(a)
    True
    """
    suffix = _digest(run_id, 8) if run_id else short_id(8)
    head = dns_label(base, max_len=max_len - len(suffix) - 1) or "run"
    return f"{head}-{suffix}"


def is_airflow_id(name: str) -> bool:
    """True when ``name`` is a valid Airflow DAG or task id (ASCII letters, digits, ``_``,
    ``.``, ``-``; 1 to 250 characters).

    Args:
        name: the id.

    >>> is_airflow_id("torchstep_torchx.q-1"), is_airflow_id("a b"), is_airflow_id("x" * 251)
    (True, False, False)
    """
    return bool(_AIRFLOW_ID.fullmatch(name))


def is_env_name(name: str) -> bool:
    """True for a portable environment variable name (POSIX / Kubernetes C_IDENTIFIER).

    Args:
        name: the variable's name.
    """
    return bool(_ENV_NAME.match(name))


def is_label_value(text: str) -> bool:
    """A label value: empty, or at most 63 ``[A-Za-z0-9_.-]`` starting and ending alphanumeric.

    Args:
        text: the value to check.
    """
    return text == "" or (len(text) <= 63 and bool(_NAME_PART.match(text)))


def is_qualified_name(text: str) -> bool:
    """A label or annotation key: ``[prefix/]name``, prefix a DNS subdomain, name at most 63.

    Args:
        text: the key to check.
    """
    prefix, sep, name = text.rpartition("/")
    if sep and not (prefix and is_dns_subdomain(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME_PART.match(name))


def is_quantity(text: str) -> bool:
    """A ``resource.Quantity`` string such as ``8Gi``, ``500m`` or ``1e3``.

    Args:
        text: the quantity to check.
    """
    return bool(_QUANTITY.match(text))


def is_port_name(text: str) -> bool:
    """A Kubernetes port name (IANA_SVC_NAME).

    Args:
        text: the ``port_map`` key to check.

    >>> is_port_name("c10d"), is_port_name("tensorboard-port")
    (True, False)
    """
    return bool(_PORT_NAME.match(text))


def is_extended_resource(text: str) -> bool:
    """An extended resource name such as ``vpc.amazonaws.com/efa``.

    Args:
        text: the resource name to check.
    """
    return bool(_EXTENDED_RESOURCE.match(text))


def env_suffix(name: str) -> str:
    """The ``<SUFFIX>`` of ``TORCHSTEP_PORT_<SUFFIX>``, a port's variable on the local target.

    Args:
        name: the port's name.

    >>> env_suffix("tensor-board")
    'TENSOR_BOARD'
    """
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in name).upper()
