"""A witness that breaks an even split: a Kubernetes ``Lease`` the two halves race to claim.

A run split in two equal halves (two replicas, one cut off from the other) has no majority:
neither side can tell whether it is the one cut off, so by :mod:`torchstep.agent.store_move`'s
rule the store stays where it is, and a silent store host leaves the other half without a
run. A witness that holds state decides instead: each half, on its own, claims the run's
``Lease`` (``coordination.k8s.io/v1``, the object Kubernetes' own leader election uses) for
the round that split. The API server's optimistic concurrency (``resourceVersion``) lets
exactly one claim through; the winner trains on (it moves the store when it lost it), the
loser stops its workers and waits to rejoin. A half cut off from the other is almost always
cut off from the API server too (the same node link): its claim fails, and it is the one that
stops — never two runs.

With ``--rdzv-conf store_witness=kubernetes`` (the Kubernetes target renders it beside
``store_takeover``) the agent reaches the API server as any in-cluster client does: the
``KUBERNETES_SERVICE_HOST``/``_PORT`` environment, the pod's service account token and CA.
The pod's service account needs ``get``, ``create`` and ``update`` on ``leases`` in its
namespace (docs/kubernetes.md has the Role). Without them the agent says so once at start and
runs without a witness (an even split keeps the store where it is, as before).

Example::

    witness = LeaseWitness.in_cluster("job-abc")
    if witness is not None and witness.check() is None:
        won = witness.claim("job-0.job.ml.svc.cluster.local:29400#3", "10.244.1.2_17_0")
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import ssl
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = ["EPOCH_ANNOTATION", "SERVICE_ACCOUNT", "WITNESS_CONF", "LeaseWitness", "lease_name"]

log = logging.getLogger("torchstep.agent")

#: ``--rdzv-conf`` key: ``kubernetes`` (a Lease in the pod's namespace) or ``off`` (default).
WITNESS_CONF = "store_witness"
#: Where Kubernetes mounts the pod's service account (token, ca.crt, namespace).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The Lease annotation naming the split a claim is for (the store's endpoint and the round).
EPOCH_ANNOTATION = "torchstep.io/split"
_ROLE_FIX = (
    "grant the pods' service account get, create and update on leases.coordination.k8s.io in "
    "the namespace (docs/kubernetes.md, 'An even split'), or set the run option store_witness=False"
)


def lease_name(run_id: str) -> str:
    """The Lease of a run: ``torchstep-store-<run_id>``, made a valid object name.

    Example: ``lease_name("Job_1")`` is ``'torchstep-store-job-1'``.
    """
    base = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"
    name = f"torchstep-store-{base}"
    if len(name) > 63:
        name = f"{name[:54]}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"
    return name


class LeaseWitness:
    """Claims of one run's Lease through the Kubernetes API.

    Args:
        server: the API server's base URL (``https://host:port``).
        namespace: the pod's namespace (the Lease lives there).
        run_id: the rendezvous run id (names the Lease).
        token: the service account's bearer token.
        context: TLS verification with the cluster's CA.

    Example: ``LeaseWitness.in_cluster("job-abc")`` inside a pod; ``None`` elsewhere.
    """

    def __init__(self, server: str, namespace: str, run_id: str, token: str, context: ssl.SSLContext) -> None:
        self.server = server.rstrip("/")
        self.namespace = namespace
        self.name = lease_name(run_id)
        self._token = token
        self._context = context

    @classmethod
    def in_cluster(cls, run_id: str, account: Path = SERVICE_ACCOUNT) -> LeaseWitness | None:
        """The witness of an in-cluster client, or ``None`` outside a pod (no
        ``KUBERNETES_SERVICE_HOST`` or no mounted service account: one warning says which)."""
        host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        port = os.environ.get("KUBERNETES_SERVICE_PORT_HTTPS") or os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            log.warning("store_witness=kubernetes: not in a pod (no KUBERNETES_SERVICE_HOST): no witness")
            return None
        try:
            token = (account / "token").read_text().strip()
            namespace = (account / "namespace").read_text().strip()
            context = ssl.create_default_context(cafile=str(account / "ca.crt"))
        except (OSError, ssl.SSLError) as e:
            log.warning(
                "store_witness=kubernetes: no service account in %s (%s; automountServiceAccountToken is "
                "false?): no witness",
                account,
                e,
            )
            return None
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return cls(f"https://{host}:{port}", namespace, run_id, token, context)

    @property
    def _url(self) -> str:
        return f"{self.server}/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"

    def _call(self, method: str, url: str, body: dict[str, Any] | None, timeout_s: float) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self._token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=self._context) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except ValueError:
                return e.code, {}

    def check(self, timeout_s: float = 5.0) -> str | None:
        """Whether this agent may claim the Lease: ``None``, or why not (with the fix). Called
        once at start, so that a missing permission is said then, not found at a split."""
        try:
            code, body = self._call("GET", f"{self._url}/{self.name}", None, timeout_s)
        except (OSError, ValueError) as e:
            return f"the API server at {self.server} did not answer ({e}); no witness"
        if code in (200, 404):
            return None
        message = body.get("message", "") if isinstance(body, dict) else ""
        return f"the API server refused to read lease {self.name} ({code}: {message}); {_ROLE_FIX}"

    def claim(self, epoch: str, me: str, timeout_s: float = 5.0) -> bool:
        """Claim the Lease for the split ``epoch`` (both halves name it alike: the lost
        store's endpoint and the round) as ``me``. Exactly one claimant of an epoch wins; the
        winner asking again wins again. An API server that does not answer within
        ``timeout_s`` is a lost claim: this half is the one cut off.

        Returns:
            ``True`` when this agent holds the Lease for ``epoch``.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("store witness: no answer from %s within %gs: the claim is lost", self.server, timeout_s)
                return False
            try:
                won = self._claim_once(epoch, me, min(left, 2.0))
            except (TimeoutError, OSError, ValueError) as e:
                log.info("store witness: %s (retrying)", e)
                time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
                continue
            if won is not None:
                return won
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))  # a race lost, a busy server: read again

    def _claim_once(self, epoch: str, me: str, timeout_s: float) -> bool | None:
        """One read and one write: the verdict, or ``None`` when a concurrent write got in
        between (read again)."""
        code, lease = self._call("GET", f"{self._url}/{self.name}", None, timeout_s)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": me, "acquireTime": now, "renewTime": now, "leaseDurationSeconds": 3600}
        if code == 404:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "labels": {"app.kubernetes.io/managed-by": "torchstep"},
                    "annotations": {EPOCH_ANNOTATION: epoch},
                },
                "spec": spec,
            }
            code, _ = self._call("POST", self._url, body, timeout_s)
            return True if code == 201 else self._again_or_refused(code)
        if code != 200:
            return self._again_or_refused(code)
        held = (lease.get("metadata", {}).get("annotations") or {}).get(EPOCH_ANNOTATION)
        if held == epoch:  # this split is decided: by this agent's claim or the other half's
            return bool(lease.get("spec", {}).get("holderIdentity") == me)
        lease.setdefault("metadata", {}).setdefault("annotations", {})[EPOCH_ANNOTATION] = epoch
        lease["spec"] = {**(lease.get("spec") or {}), **spec}
        code, _ = self._call("PUT", f"{self._url}/{self.name}", lease, timeout_s)
        return True if code == 200 else self._again_or_refused(code)

    def _again_or_refused(self, code: int) -> bool | None:
        """``None`` (read again) for a write that lost a race (409) or a server too busy to
        answer now (429, 5xx: within the claim's bound); ``False`` for a refusal."""
        if code in (409, 429) or code >= 500:
            return None
        log.warning("store witness: the API server answered %d to a claim of lease %s: lost", code, self.name)
        return False
