"""The API server as pods reach it: ``https://10.244.0.1:443`` in the cluster's network, with
the service account's token and CA mounted in each pod (test infrastructure, not product code).

A real pod reaches its API server through the ``kubernetes`` Service (``KUBERNETES_SERVICE_HOST``
and ``_PORT`` in its environment), over TLS checked with the CA in
``/var/run/secrets/kubernetes.io/serviceaccount/ca.crt``, with that directory's ``token`` as a
bearer token and its ``namespace`` as the default namespace. Here the same API (``tests/kubehttp.py``'s
handler, the same objects) also listens on ``br0``'s address in the cluster's network namespace:
a pod whose node is partitioned (its uplink down) cannot reach it, as a partitioned node cannot
reach a real control plane. The CA is made when the cluster starts; a request without the token
gets ``401``. Not played: RBAC (every authenticated request is allowed).
"""

from __future__ import annotations

import ctypes
import datetime
import ipaddress
import os
import secrets
import ssl
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cluster.kubelet import DNS_IP

__all__ = ["PORT", "ServiceAccount", "serve_in_cluster"]

PORT = 443
_CLONE_NEWNET = 0x40000000


class ServiceAccount:
    """The files every pod gets at ``/var/run/secrets/kubernetes.io/serviceaccount``: the
    cluster's CA and one token (the namespace file is the pod's own: the kubelet writes it)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "serviceaccount"
        self.ca = self.dir / "ca.crt"
        self.token_file = self.dir / "token"

    @property
    def token(self) -> str:
        return self.token_file.read_text().strip()

    def make(self) -> tuple[Path, Path]:
        """A self-signed CA that is also the server's certificate (``10.244.0.1``,
        ``kubernetes.default.svc``) and a random token. Returns (certificate, key)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self.dir.mkdir(parents=True, exist_ok=True)
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "onemachine-apiserver")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.IPAddress(ipaddress.ip_address(DNS_IP)),
                        x509.DNSName("kubernetes.default.svc"),
                        x509.DNSName("kubernetes.default.svc.cluster.local"),
                    ]
                ),
                critical=False,
            )
            .sign(key, hashes.SHA256())
        )
        self.ca.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_file = self.dir / "apiserver.key"
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
                )
            )
        self.token_file.write_text(secrets.token_urlsafe(24))
        return self.ca, key_file


def _setns(fd: int) -> None:
    """Move the calling thread into the network namespace ``fd`` refers to."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def serve_in_cluster(handler: type[Any], netns: str, account: ServiceAccount) -> ThreadingHTTPServer:
    """Serve ``handler`` (the API) on ``https://10.244.0.1:443`` in network namespace ``netns``:
    the listening socket is made in that namespace (by a thread that enters it and leaves
    again: a namespace is per thread), the connections it accepts live there."""
    cert, key = account.make()
    token = account.token

    class InCluster(handler):  # type: ignore[misc,valid-type]
        timeout = 10  # a connection silent that long (its pod's node cut off) is closed

        def parse_request(self) -> bool:
            if not super().parse_request():
                return False
            if self.headers.get("Authorization", "") != f"Bearer {token}":
                self._send(401, {"kind": "Status", "status": "Failure", "reason": "Unauthorized", "code": 401})
                return False
            return True

    made: list[Any] = []

    def bind() -> None:
        try:
            # opened before entering: once there, this thread's /proc entry names the new namespace
            own = os.open(f"/proc/{os.getpid()}/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
            try:
                target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
                try:
                    _setns(target)
                finally:
                    os.close(target)
                try:
                    made.append(ThreadingHTTPServer((DNS_IP, PORT), InCluster))
                finally:
                    _setns(own)
            finally:
                os.close(own)
        except Exception as e:  # handed to the caller
            made.append(e)

    thread = threading.Thread(target=bind, name="incluster-bind")
    thread.start()
    thread.join()
    if isinstance(made[0], Exception):
        raise made[0]
    server: ThreadingHTTPServer = made[0]
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    # the handshake in each connection's own thread (a client cut off mid-handshake never
    # holds the accept loop), bounded by the handler's timeout
    server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
    threading.Thread(target=server.serve_forever, name="incluster-api", daemon=True).start()
    return server
