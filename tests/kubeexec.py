"""The pods ``exec`` subresource of the one-machine cluster's API server (``tests/kubehttp.py
--real``): ``GET``/``POST /api/v1/namespaces/{ns}/pods/{name}/exec?command=...&container=...
&stdin=&stdout=&stderr=&tty=`` over a WebSocket upgrade (RFC 6455), as the official Python
client's ``kubernetes.stream.stream(...)`` (hence ``kubectl exec``'s protocol and the
KubernetesPodOperator's XCom sidecar reads) speaks it.

- Subprotocols ``v4.channel.k8s.io`` (preferred) and ``channel.k8s.io``: every data frame
  starts with its channel byte, 0 stdin, 1 stdout, 2 stderr, 3 the error channel; in v4 the
  error channel carries the command's status as JSON (``Success``, or ``Failure`` with
  ``reason: NonZeroExitCode`` and the exit code in ``details.causes``), then the server
  closes the connection.
- The command runs inside the pod's namespaces (mount with its root and working directory,
  UTS, IPC, network, PID) with the container's environment, as its readiness probe does
  (``cluster/kubelet.py``), in any of the pod's running containers (a sidecar too).
- Errors as the API server gives them, before the upgrade: 404 ``NotFound`` for an unknown
  pod, 400 ``BadRequest`` for an unknown container, a pod whose container is not running, a
  request without a command or without the WebSocket upgrade.

Stdlib only (test infrastructure: no new dependency). No tty (``tty=true`` is refused), no
resize channel (4), no SPDY.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import urllib.parse
from typing import Any

#: RFC 6455's GUID, hashed with the client's key into ``Sec-WebSocket-Accept``.
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
PROTOCOLS = ("v4.channel.k8s.io", "channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR = 0, 1, 2, 3
_TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x1, 0x2, 0x8, 0x9, 0xA


def exec_path(path: str) -> tuple[str, str] | None:
    """``(namespace, pod)`` when ``path`` is a pod's ``exec`` subresource, else ``None``.

    >>> exec_path("/api/v1/namespaces/ml/pods/p-0/exec?command=ls")
    ('ml', 'p-0')
    >>> exec_path("/api/v1/namespaces/ml/pods/p-0/log") is None
    True
    """
    parts = urllib.parse.urlsplit(path).path.strip("/").split("/")
    if len(parts) == 7 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods" and parts[6] == "exec":
        return parts[3], parts[5]
    return None


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (query.get(name) or ["false"])[-1].lower() in ("true", "1")


def target(cluster: Any, ns: str, name: str, container: str | None) -> tuple[int, dict[str, Any]] | tuple[int, Any]:
    """Where an exec into ``ns/name``'s ``container`` runs: ``(0, (pid, env, cgroup))`` or the API's
    error ``(code, Status)`` (read under the cluster's lock)."""
    with cluster.lock:
        pod = cluster.objects.get(("Pod", ns, name))
        if pod is None:
            return 404, _status(404, "NotFound", f'pods "{name}" not found')
        names = [c.get("name") for c in pod["spec"].get("containers") or []]
        container = container or (names[0] if len(names) == 1 else None)
        if container is None:
            return 400, _status(
                400,
                "BadRequest",
                f"a container name must be specified for pod {name}, choose one of: [{' '.join(map(str, names))}]",
            )
        if container not in names:
            return 400, _status(400, "BadRequest", f"container {container} is not valid for pod {name}")
        proc = getattr(cluster, "procs", {}).get(pod["metadata"]["uid"])
        phase = pod["status"].get("phase")
        if phase in ("Succeeded", "Failed"):
            return 400, _status(
                400, "BadRequest", f"cannot exec into a container in a completed pod; current phase is {phase}"
            )
        if proc is None:
            return 400, _status(400, "BadRequest", f"container {container} is not running in pod {name}")
        if container == proc.container:
            box: Any = None if proc.main_ended.is_set() or proc.ended.is_set() else proc
        else:
            box = next((c for c in proc.sidecars if c.name == container and not c.ended.is_set()), None)
    pid = box.pid1(timeout=2.0) if box is not None else None
    if pid is None:
        return 400, _status(400, "BadRequest", f"container {container} is not running in pod {name}")
    return 0, (pid, dict(box.env), proc.cgroup)


class _Socket:
    """The server's side of one WebSocket: frames out (unmasked, under a lock: two reader
    threads send), frames in (masked by the client)."""

    def __init__(self, sock: socket.socket, rfile: Any) -> None:
        self.sock, self.rfile = sock, rfile
        self._lock = threading.Lock()
        self.closed = False

    def send(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([n])
        elif n < 1 << 16:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        with self._lock:
            if self.closed:
                return
            try:
                self.sock.sendall(head + payload)
            except OSError:
                self.closed = True

    def channel(self, channel: int, data: bytes) -> None:
        self.send(_BINARY, bytes([channel]) + data)

    def close(self, code: int = 1000) -> None:
        self.send(_CLOSE, struct.pack(">H", code))
        with self._lock:
            self.closed = True

    def _read(self, n: int) -> bytes:
        data = self.rfile.read(n)
        if len(data) < n:
            raise EOFError
        return bytes(data)

    def recv(self) -> tuple[int, bytes]:
        """One whole message (fragments joined): ``(opcode, payload)``; EOFError at the end."""
        opcode, message = None, b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else b"\0\0\0\0"
            payload = bytes(c ^ mask[i % 4] for i, c in enumerate(self._read(n)))
            op = b0 & 0x0F
            if op >= 0x8:  # control frames may come between fragments
                return op, payload
            opcode = op if opcode is None else opcode
            message += payload
            if b0 & 0x80:
                return opcode, message


def serve(handler: Any, ns: str, name: str) -> None:
    """Answer one exec request on ``handler`` (a ``BaseHTTPRequestHandler`` of kubehttp).

    Args:
        handler: the request's handler (its ``cluster`` is a ``RealCluster``).
        ns: the pod's namespace.
        name: the pod's name.
    """
    handler.close_connection = True
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
    command = query.get("command") or []
    streams = {c: _flag(query, n) for c, n in ((STDIN, "stdin"), (STDOUT, "stdout"), (STDERR, "stderr"))}
    wanted = [p.strip() for p in (handler.headers.get("Sec-WebSocket-Protocol") or "").split(",")]
    protocol = next((p for p in PROTOCOLS if p in wanted), None)

    refuse = handler._send  # the API server's JSON answer (kubehttp.Handler)

    answer = target(handler.cluster, ns, name, (query.get("container") or [None])[-1])
    if answer[0] != 0:
        return refuse(*answer)
    if not command:
        return refuse(400, _status(400, "BadRequest", "you must specify at least 1 command"))
    if _flag(query, "tty"):
        return refuse(400, _status(400, "BadRequest", "tty=true is not supported by the one-machine cluster"))
    if not any(streams.values()):
        return refuse(400, _status(400, "BadRequest", "you must specify at least 1 of stdin, stdout, stderr"))
    key = handler.headers.get("Sec-WebSocket-Key")
    if (handler.headers.get("Upgrade") or "").lower() != "websocket" or not key or protocol is None:
        return refuse(400, _status(400, "BadRequest", f"Upgrade request required (WebSocket, subprotocol {PROTOCOLS})"))
    pid, env, cgroup = answer[1]
    accept = base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()
    handler.send_response(101, "Switching Protocols")
    handler.send_header("Upgrade", "websocket")
    handler.send_header("Connection", "Upgrade")
    handler.send_header("Sec-WebSocket-Accept", accept)
    handler.send_header("Sec-WebSocket-Protocol", protocol)
    handler.end_headers()
    handler.wfile.flush()
    ws = _Socket(handler.connection, handler.rfile)
    # inside the pod, as its readiness probe runs (root, working directory, namespaces), and in
    # its cgroup (its memory limit holds; the pod's processes include it, as a runtime's exec)
    argv = ["nsenter", f"--target={pid}", "--mount", "--uts", "--ipc", "--net", "--pid", "--root", "--wd", "--"]
    if cgroup is not None:
        argv = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *argv]
    pipe = subprocess.PIPE
    try:
        proc = subprocess.Popen(
            [*argv, *command],
            env=env,
            stdin=pipe if streams[STDIN] else subprocess.DEVNULL,
            stdout=pipe if streams[STDOUT] else subprocess.DEVNULL,
            stderr=pipe if streams[STDERR] else subprocess.DEVNULL,
            start_new_session=True,  # nsenter forks the command into the pod's PID namespace: one group
        )
    except OSError as e:
        ws.channel(ERROR, json.dumps({"metadata": {}, "status": "Failure", "message": str(e)}).encode())
        return ws.close()

    def pump(channel: int, stream: Any) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            ws.channel(channel, chunk)

    pumps = [
        threading.Thread(target=pump, args=(c, s), daemon=True)
        for c, s in ((STDOUT, proc.stdout), (STDERR, proc.stderr))
        if s is not None
    ]
    for t in pumps:
        t.start()
    threading.Thread(target=_feed, args=(ws, proc), daemon=True).start()
    code = proc.wait()
    for t in pumps:
        t.join()
    if code == 0:
        status: dict[str, Any] = {"metadata": {}, "status": "Success"}
    else:
        status = {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: error executing command {command}, exit code {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    if protocol.startswith("v4.") or code != 0:  # channel.k8s.io: a bare error text, none on success
        ws.channel(ERROR, json.dumps(status).encode() if protocol.startswith("v4.") else status["message"].encode())
    ws.close()


def _feed(ws: _Socket, proc: subprocess.Popen[bytes]) -> None:
    """The client's frames: channel 0 into the command's stdin; the client's close (or its
    connection's end) ends the command."""
    try:
        while True:
            opcode, payload = ws.recv()
            if opcode == _PING:
                ws.send(_PONG, payload)
            elif opcode == _CLOSE:
                break
            elif opcode in (_TEXT, _BINARY) and payload[:1] == bytes([STDIN]) and proc.stdin is not None:
                try:
                    proc.stdin.write(payload[1:])
                    proc.stdin.flush()
                except OSError:  # the command closed its stdin or ended
                    pass
    except (EOFError, OSError):
        pass
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    if proc.poll() is None:  # the client went away: nothing of the exec stays behind in the pod
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
