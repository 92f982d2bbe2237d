"""Kubernetes name and value syntax (the API server's own rules, checked before rendering
so a bad option is a SpecError naming the field, not a rejected ``kubectl apply``).

Example::

    >>> is_label_value("p4d.24xlarge"), is_label_value("-x")
    (True, False)
    >>> is_qualified_name("kueue.x-k8s.io/queue-name"), is_quantity("8Gi"), is_quantity("8 GB")
    (True, True, False)
"""

from __future__ import annotations

import re

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
# resource.Quantity: a decimal number with an optional binary/decimal SI suffix or exponent
_QUANTITY = re.compile(r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")


def is_dns_label(text: str) -> bool:
    """RFC 1123 label (pod hostnames, most object names): ``[a-z0-9-]``, at most 63."""
    return len(text) <= 63 and bool(_DNS_LABEL.match(text))


def is_dns_1035_label(text: str) -> bool:
    """RFC 1035 label (Service names): like a DNS-1123 label but starts with a letter."""
    return len(text) <= 63 and bool(_DNS_1035.match(text))


def is_dns_subdomain(text: str) -> bool:
    """RFC 1123 subdomain (claim, Secret, ServiceAccount, PriorityClass names): at most 253."""
    return len(text) <= 253 and bool(_SUBDOMAIN.match(text))


def is_label_value(text: str) -> bool:
    """A label value: empty, or at most 63 ``[A-Za-z0-9_.-]`` starting and ending alphanumeric."""
    return text == "" or (len(text) <= 63 and bool(_NAME_PART.match(text)))


def is_qualified_name(text: str) -> bool:
    """A label or annotation key: ``[prefix/]name``, prefix a DNS subdomain, name at most 63."""
    prefix, sep, name = text.rpartition("/")
    if sep and not (prefix and is_dns_subdomain(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_NAME_PART.match(name))


def is_quantity(text: str) -> bool:
    """A ``resource.Quantity`` string such as ``8Gi``, ``500m`` or ``1e3``."""
    return bool(_QUANTITY.match(text))
