"""A kubelet for the one-machine cluster: every pod runs for real, on this machine.

Test infrastructure, not product code. Each pod is one process tree in

- its own **network namespace** (``ip netns``) with its own IP from ``10.244.0.0/16`` on a
  bridge that lives in the cluster's own network namespace (nothing touches the machine's
  interfaces or loopback): the cluster namespace holds ``br0`` (``10.244.0.1``, where the
  cluster DNS listens) and one bridge per node, linked to ``br0`` by a veth pair (the node's
  uplink: down = the node is partitioned); a pod's veth hangs on its node's bridge;
- its own **UTS, PID and mount namespaces** (bubblewrap): hostname = the pod's ``hostname``
  or name, the container's first process is PID 1, ``/etc/hosts`` (kubelet's lines, with the
  pod's FQDN when ``subdomain`` is set) and ``/etc/resolv.conf`` (the cluster DNS and its
  search path) bind-mounted, a private ``/tmp``, ``/dev`` with the termination-message file;
  volumes (``emptyDir``, ``medium: Memory`` as a tmpfs of its ``sizeLimit``, ``hostPath``,
  a PVC as one directory per claim) bind-mounted at their ``mountPath``, read-only where asked;
- the **service account** (``automountServiceAccountToken`` unless false): the cluster's CA,
  a token and the pod's namespace at ``/var/run/secrets/kubernetes.io/serviceaccount``, and
  ``KUBERNETES_SERVICE_HOST``/``_PORT`` naming the API as pods reach it
  (``tests/cluster/incluster.py``);
- its own **cgroup v1 memory controller** group with the container's memory limit: going
  over it is an ``OOMKilled`` termination with exit code 137;
- its container's **exec readinessProbe**, run as kubelet does: inside the pod's mount, UTS,
  IPC, network and PID namespaces (``nsenter`` into its PID 1) with the container's
  environment, after ``initialDelaySeconds``, every ``periodSeconds``, each try bounded by
  ``timeoutSeconds``; ``successThreshold`` passes in a row make it ready,
  ``failureThreshold`` failures in a row unready (reported through ``on_ready``). Other
  probe handlers (httpGet, tcpSocket, grpc) are not played: such a probe never passes;
- its **other containers** (``containers[1:]``, such as the KubernetesPodOperator's XCom
  sidecar), each its own bubblewrap sandbox (own mount and PID namespaces, its own volume
  mounts, environment and log) in the pod's network namespace and cgroup; the pod lives until
  every container has ended (``on_main_end`` reports the first one's end before), and
  deleting it signals each container's PID 1. Its ``exec`` subresource (``tests/kubeexec.py``)
  enters any running container as the probe does, in the pod's cgroup.

The image is never pulled: a pod runs on this machine's filesystem, with the checkout's
virtual environment first on ``PATH`` (``KubeletConfig.path``); the "image's" environment is
``PATH``, ``HOME=/root``, ``HOSTNAME`` and ``XDG_STATE_HOME=/tmp/.state`` (the pod's private
``/tmp``, so pods never share the agent's state directory), then the container's ``env``. Deleting a pod sends SIGTERM
to its PID 1 and SIGKILL after ``terminationGracePeriodSeconds``. Its stdout and stderr are
its log (one file, each line prefixed by the RFC 3339 time it was read); the file at
``terminationMessagePath`` is read into the status (at most 4096 bytes, as kubelet), with
``FallbackToLogsOnError`` the log's tail when the file is empty and the container failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubeexpand import expand  # tests/ is on the path (pytest, kubehttp.py)

SUBNET = "10.244"  # the cluster's own test range; nothing outside it is ever addressed
DNS_IP = f"{SUBNET}.0.1"
DOMAIN = "cluster.local"
INDEX = "batch.kubernetes.io/job-completion-index"
MESSAGE_CAP = 4096  # kubelet reads at most this much of terminationMessagePath


def image_binds() -> list[str]:
    """The pods' "image" is this machine's root with a private /tmp: a checkout (and its
    virtualenv and interpreter) that lives under /tmp is bound back into it, as an image
    would carry them."""
    paths = {Path(__file__).resolve().parents[2], Path(sys.prefix), Path(sys.base_prefix)}
    inside = sorted(str(p) for p in paths if p.is_relative_to("/tmp"))
    return [arg for p in inside for arg in ("--bind", p, p)]


#: Where a pod finds its service account (``tests/cluster/incluster.py``).
SERVICE_ACCOUNT_MOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount").resolve()  # /var/run: /run

FALLBACK_LINES, FALLBACK_BYTES = 80, 2048  # FallbackToLogsOnError: the log's tail, as kubelet


def stamp(t: float | None = None) -> str:
    """RFC 3339 with nanoseconds, as kubelet writes log timestamps."""
    t = time.time() if t is None else t
    whole = int(t)
    return datetime.fromtimestamp(whole, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{int((t - whole) * 1e9):09d}Z"


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(int(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one administrative command (``ip``), its output captured."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def memory_cgroup_root() -> Path:
    """The cgroup v1 memory group this process is in (the pods' groups nest under it)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise RuntimeError("no cgroup v1 memory controller (/proc/self/cgroup has no memory line)")


def quantity_bytes(q: str | int) -> int:
    """A Kubernetes quantity (``1024Mi``, ``1G``, ``500M``) in bytes."""
    text = str(q)
    factors = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in factors.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


class ConfigError(Exception):
    """The pod cannot start as written (``CreateContainerConfigError``)."""


# -- the network ---------------------------------------------------------------------------------------
class Network:
    """The cluster's network: its own namespace with ``br0`` and one bridge per node; every
    pod a namespace of its own with a veth on its node's bridge."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix  # names every namespace and link of this cluster (cleanup by prefix)
        self.ns = f"{prefix}c"
        self.nodes: list[str] = []
        self._next: dict[int, int] = {}
        self._lock = threading.Lock()

    def up(self, nodes: list[str]) -> None:
        run("ip", "netns", "add", self.ns)
        run("ip", "-n", self.ns, "link", "set", "lo", "up")
        run("ip", "-n", self.ns, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.ns, "addr", "add", f"{DNS_IP}/16", "dev", "br0")
        run("ip", "-n", self.ns, "link", "set", "br0", "up")
        for i, _ in enumerate(nodes):
            run("ip", "-n", self.ns, "link", "add", f"nb{i}", "type", "bridge")
            run("ip", "-n", self.ns, "link", "add", f"nu{i}", "type", "veth", "peer", "name", f"nd{i}")
            run("ip", "-n", self.ns, "link", "set", f"nu{i}", "master", "br0")
            run("ip", "-n", self.ns, "link", "set", f"nd{i}", "master", f"nb{i}")
            for link in (f"nb{i}", f"nu{i}", f"nd{i}"):
                run("ip", "-n", self.ns, "link", "set", link, "up")
        self.nodes = list(nodes)

    def attach(self, node: str, slot: int) -> tuple[str, str]:
        """A new pod namespace on ``node``: (its name, its IP)."""
        i = self.nodes.index(node)
        with self._lock:
            host = self._next.get(i, 2)
            self._next[i] = host + 1
        if host > 254:
            raise RuntimeError(f"node {node} has no address left")
        ip = f"{SUBNET}.{i + 1}.{host}"
        ns = f"{self.prefix}p{slot}"
        run("ip", "netns", "add", ns)
        run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", self.ns, "link", "add", f"p{slot}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "-n", self.ns, "link", "set", f"p{slot}", "master", f"nb{i}")
        run("ip", "-n", self.ns, "link", "set", f"p{slot}", "up")
        run("ip", "-n", ns, "addr", "add", f"{ip}/16", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        return ns, ip

    def detach(self, ns: str, slot: int) -> None:
        run("ip", "-n", self.ns, "link", "del", f"p{slot}", check=False)
        run("ip", "netns", "del", ns, check=False)

    def set_pod_link(self, slot: int, up: bool) -> None:
        run("ip", "-n", self.ns, "link", "set", f"p{slot}", "up" if up else "down", check=False)

    def set_node_link(self, node: str, up: bool) -> None:
        run("ip", "-n", self.ns, "link", "set", f"nu{self.nodes.index(node)}", "up" if up else "down")

    def down(self) -> None:
        """Delete every namespace of this cluster (its links go with them)."""
        for name in list_netns():
            if name.startswith(self.prefix):
                run("ip", "netns", "del", name, check=False)


def list_netns() -> list[str]:
    out = run("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


# -- cluster DNS -----------------------------------------------------------------------------------------
class Dns:
    """dnsmasq on ``br0`` inside the cluster's namespace, authoritative for ``cluster.local``
    (``--local``: a name it does not hold is NXDOMAIN, never forwarded; it has no upstream).
    Records are files in a hosts directory, which dnsmasq re-reads when they change."""

    def __init__(self, root: Path, netns: str, cgroup: Path) -> None:
        self.cgroup = cgroup
        self.dir = root / "dns"
        self.staging = root / "dns.staging"
        self.netns = netns
        self.proc: subprocess.Popen[bytes] | None = None
        self.published: dict[str, str] = {}

    def start(self) -> None:
        for d in (self.dir, self.staging):
            d.mkdir(parents=True, exist_ok=True)
        log = open(self.dir.parent / "dnsmasq.log", "wb")  # noqa: SIM115 - the child owns it
        self.cgroup.mkdir(exist_ok=True)
        self.proc = subprocess.Popen(
            [
                "sh",
                "-c",
                'echo $$ > "$0" && exec "$@"',
                str(self.cgroup / "cgroup.procs"),
                "nsenter",
                f"--net=/run/netns/{self.netns}",
                "dnsmasq",
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--bind-interfaces",
                f"--listen-address={DNS_IP}",
                "--port=53",
                f"--local=/{DOMAIN}/",
                "--domain-needed",
                "--bogus-priv",
                f"--hostsdir={self.dir}",
                "--user=root",
                "--group=root",
                "--pid-file=",
                "--log-facility=-",
                "--local-ttl=1",
                "--neg-ttl=1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while "0100F40A:0035" not in Path(f"/proc/{self.proc.pid}/net/udp").read_text().upper():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dnsmasq did not start: {(self.dir.parent / 'dnsmasq.log').read_text()}")
            time.sleep(0.05)

    def sync(self, records: Mapping[str, str]) -> None:
        """Publish exactly ``records`` (file key -> hosts lines)."""
        for key in set(self.published) - set(records):
            with contextlib.suppress(FileNotFoundError):
                (self.dir / key).unlink()
            del self.published[key]
        for key, text in records.items():
            if self.published.get(key) != text:
                tmp = self.staging / key
                tmp.write_text(text)
                tmp.replace(self.dir / key)  # a rename: dnsmasq never reads half a file
                self.published[key] = text

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- pods ------------------------------------------------------------------------------------------------
@dataclass
class KubeletConfig:
    """What every pod of this cluster gets from the "image" (which is never pulled)."""

    root: Path  # pod directories, emptyDirs, PVCs, DNS records
    path: str  # PATH inside every pod: the checkout's venv first
    prefix: str  # namespaces and cgroups of this cluster start with it
    workdir: str = "/"  # a container's working directory when it sets none


@dataclass
class Sidecar:
    """A container of a pod after its first (``containers[1:]``, such as the KubernetesPodOperator's
    XCom sidecar): its own process, mount and PID namespaces and volumes, in the pod's network
    namespace and cgroup; its output goes to ``log``."""

    name: str
    launcher: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    ended: threading.Event = field(default_factory=threading.Event)

    def pid1(self, timeout: float = 5.0) -> int | None:
        """The host PID of this container's PID 1 (bubblewrap's child)."""
        return _pid1(self.proc, timeout)


def _pid1(proc: subprocess.Popen[bytes] | None, timeout: float, started: bool = True) -> int | None:
    """Bubblewrap's child: once it has exec'd the container's command (``started``), or as
    soon as it is forked (a signal: a container still being set up dies of it too)."""
    if proc is None:
        return None
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        with contextlib.suppress(OSError):
            kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            # bubblewrap's child is the container only once it has exec'd the command: before,
            # it still sets up the sandbox (its mounts), and a process entering it (exec, a
            # probe) would find no container's root yet (a loaded machine's race)
            if kids and (not started or _exe(int(kids[0])) != _exe(proc.pid)):
                return int(kids[0])
        if time.monotonic() > deadline:
            return None
        time.sleep(0.02)
    return None


def _exe(pid: int) -> tuple[int, int]:
    """The file a process runs (device and inode: its path may be another mount namespace's)."""
    st = os.stat(f"/proc/{pid}/exe")
    return st.st_dev, st.st_ino


@dataclass
class PodProcess:
    """One pod's sandbox and its container's process, as this kubelet runs them."""

    ns: str
    name: str
    uid: str
    node: str
    slot: int
    dir: Path
    container: str
    grace_s: float
    netns: str = ""
    ip: str = ""
    cgroup: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    started_at: float | None = None
    finished_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    message: str | None = None
    waiting: tuple[str, str] | None = None  # (reason, message) of a container that cannot start
    message_path: Path | None = None
    fallback: bool = False
    deleting: bool = False
    probe: dict[str, Any] | None = None  # the container's readinessProbe
    env: dict[str, str] = field(default_factory=dict)  # the container's environment (probes run with it)
    ready: bool = False  # the readinessProbe's verdict
    ended: threading.Event = field(default_factory=threading.Event)  # every container has ended
    sidecars: list[Sidecar] = field(default_factory=list)  # its containers after the first
    main_ended: threading.Event = field(default_factory=threading.Event)  # the first container ended
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.dir / "container.log"

    def pid1(self, timeout: float = 5.0) -> int | None:
        """The host PID of the container's PID 1 (bubblewrap's child)."""
        return _pid1(self.proc, timeout)

    def signal(self, sig: int) -> None:
        """``sig`` to the PID 1 of each of the pod's containers that runs."""
        pids = [_pid1(self.proc, 2.0, started=False)] if not self.main_ended.is_set() else []
        pids += [_pid1(c.proc, 2.0, started=False) for c in self.sidecars if not c.ended.is_set()]
        for pid in pids:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)


class Kubelet:
    """Runs pods for real (see the module docstring); one per cluster, for all its nodes."""

    def __init__(
        self,
        config: KubeletConfig,
        network: Network,
        on_end: Callable[[PodProcess], None],
        on_start: Callable[[PodProcess], None] | None = None,
        on_ready: Callable[[PodProcess, bool], None] | None = None,
    ) -> None:
        self.config = config
        self.network = network
        self.on_end = on_end
        self.on_start = on_start or (lambda p: None)
        self.on_ready = on_ready or (lambda p, ready: None)
        #: The first container of a pod with sidecars ended (they still run): set by the control plane.
        self.on_main_end: Callable[[PodProcess], None] = lambda p: None
        self.cgroups = memory_cgroup_root() / f"{config.prefix}pods"
        self.cgroups.mkdir(exist_ok=True)
        self.pods: dict[str, PodProcess] = {}  # pod uid -> its process
        self._slot = 0
        self._lock = threading.Lock()

    # the pod's environment and command ------------------------------------------------------------
    def container_env(self, pod: Mapping[str, Any], container: Mapping[str, Any], ip: str) -> dict[str, str]:
        """The container's environment: the image's (PATH, HOME), HOSTNAME, then its ``env``
        in order, each value ``$(VAR)``-expanded over those before it, downward-API values
        resolved."""
        meta, spec = pod["metadata"], pod["spec"]
        env = {
            "PATH": self.config.path,
            "HOME": "/root",
            "HOSTNAME": spec.get("hostname") or meta["name"],
            "XDG_STATE_HOME": "/tmp/.state",
        }
        if self._service_account(pod) is not None:  # the ``kubernetes`` Service, as kubelet sets it
            env.update(
                KUBERNETES_SERVICE_HOST=DNS_IP, KUBERNETES_SERVICE_PORT="443", KUBERNETES_SERVICE_PORT_HTTPS="443"
            )
        fields = {
            "metadata.name": meta["name"],
            "metadata.namespace": meta["namespace"],
            "metadata.uid": meta["uid"],
            "status.podIP": ip,
            "status.hostIP": DNS_IP,
            "spec.nodeName": spec.get("nodeName", ""),
            "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        }
        for key, value in (meta.get("annotations") or {}).items():
            fields[f"metadata.annotations['{key}']"] = value
        for key, value in (meta.get("labels") or {}).items():
            fields[f"metadata.labels['{key}']"] = value
        for i, item in enumerate(container.get("env") or []):
            name = item["name"]
            if "value" in item:
                env[name] = expand(str(item["value"]), env)
                continue
            source = item.get("valueFrom") or {}
            ref = source.get("fieldRef")
            if ref is None:
                kind = next(iter(source), "valueFrom")
                raise ConfigError(f"env[{i}] ({name}): {kind} is not served by this one-machine cluster")
            if ref["fieldPath"] not in fields:
                raise ConfigError(f'env[{i}] ({name}): fieldRef "{ref["fieldPath"]}" has no value on this pod')
            env[name] = fields[ref["fieldPath"]]
        return env

    def _service_account(self, pod: Mapping[str, Any]) -> Path | None:
        """The cluster's service-account files (``tests/cluster/incluster.py``), unless the pod
        sets ``automountServiceAccountToken: false`` or the cluster serves no in-cluster API."""
        found = self.config.root / "serviceaccount"
        if pod["spec"].get("automountServiceAccountToken") is False or not (found / "ca.crt").exists():
            return None
        return found

    def _volumes(self, pod: Mapping[str, Any], container: Mapping[str, Any], podir: Path) -> list[str]:
        """bubblewrap arguments that mount the container's ``volumeMounts`` (and the service
        account's token, CA and namespace where the pod gets them)."""
        volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
        args: list[str] = []
        account = self._service_account(pod)
        if account is not None:
            mine = podir / "serviceaccount"
            if not mine.exists():
                mine.mkdir()
                for name in ("ca.crt", "token"):
                    shutil.copyfile(account / name, mine / name)
                (mine / "namespace").write_text(pod["metadata"]["namespace"])
            SERVICE_ACCOUNT_MOUNT.mkdir(parents=True, exist_ok=True)  # the mount point, on this root
            args += ["--ro-bind", str(mine), str(SERVICE_ACCOUNT_MOUNT)]
        for i, mount in enumerate(container.get("volumeMounts") or []):
            volume = volumes.get(mount["name"])
            if volume is None:
                raise ConfigError(f"volumeMounts[{i}]: no volume named {mount['name']!r}")
            ro = bool(mount.get("readOnly"))
            target = mount["mountPath"]
            if "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    size = empty.get("sizeLimit")
                    args += (["--size", str(quantity_bytes(size))] if size else []) + ["--tmpfs", target]
                    if ro:
                        args += ["--remount-ro", target]
                    continue
                source = podir / "volumes" / mount["name"]
                source.mkdir(parents=True, exist_ok=True)
            elif "hostPath" in volume:
                source = Path(volume["hostPath"]["path"])
                if volume["hostPath"].get("type") == "DirectoryOrCreate":
                    source.mkdir(parents=True, exist_ok=True)
                if not source.exists():
                    raise ConfigError(f"volumes[{mount['name']}].hostPath.path: {source} does not exist on the node")
            elif "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                source = self.config.root / "pvc" / pod["metadata"]["namespace"] / claim
                source.mkdir(parents=True, exist_ok=True)
                ro = ro or bool(volume["persistentVolumeClaim"].get("readOnly"))
            else:
                kind = next((k for k in volume if k != "name"), "?")
                raise ConfigError(
                    f"volumes[{mount['name']}]: {kind} volumes are not served by this one-machine cluster"
                )
            if mount.get("subPath"):
                source = source / mount["subPath"]
            args += ["--ro-bind" if ro else "--bind", str(source), target]
        return args

    def hosts_file(self, pod: Mapping[str, Any], ip: str) -> str:
        """/etc/hosts as kubelet writes it."""
        meta, spec = pod["metadata"], pod["spec"]
        host = spec.get("hostname") or meta["name"]
        lines = [
            "# Kubernetes-managed hosts file.",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            "fe00::0\tip6-localnet",
            "fe00::0\tip6-mcastprefix",
            "fe00::1\tip6-allnodes",
            "fe00::2\tip6-allrouters",
        ]
        if spec.get("subdomain"):
            lines.append(f"{ip}\t{host}.{spec['subdomain']}.{meta['namespace']}.svc.{DOMAIN}\t{host}")
        else:
            lines.append(f"{ip}\t{host}")
        return "\n".join(lines) + "\n"

    def resolv_conf(self, namespace: str) -> str:
        return f"search {namespace}.svc.{DOMAIN} svc.{DOMAIN} {DOMAIN}\nnameserver {DNS_IP}\noptions ndots:5\n"

    # lifecycle --------------------------------------------------------------------------------------
    def start(self, pod: dict[str, Any], node: str, pull_s: float = 0.0) -> PodProcess:
        """Create the pod's sandbox on ``node`` (its IP, hence its DNS name, exist from now on)
        and start its (first) container, ``pull_s`` seconds later when the node's "image
        pulls" are slowed (the container waits in ``ContainerCreating``, as behind a pull)."""
        meta, spec = pod["metadata"], pod["spec"]
        container = (spec.get("containers") or [{}])[0]
        with self._lock:
            self._slot += 1
            slot = self._slot
        podir = self.config.root / "pods" / f"{meta['namespace']}_{meta['name']}_{meta['uid'][:8]}"
        podir.mkdir(parents=True, exist_ok=True)
        grace = spec.get("terminationGracePeriodSeconds", 30)
        p = PodProcess(
            meta["namespace"],
            meta["name"],
            meta["uid"],
            node,
            slot,
            podir,
            container.get("name", "main"),
            float(grace),
            probe=container.get("readinessProbe"),
        )
        self.pods[p.uid] = p
        p.log.touch()
        p.netns, p.ip = self.network.attach(node, slot)
        try:
            env = self.container_env(pod, container, p.ip)
            argv = [expand(a, env) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
            if not argv:
                raise ConfigError("containers[0].command: empty, and no image is pulled to give an entrypoint")
            volumes = self._volumes(pod, container, podir)
            extra = []  # the containers after the first: (spec, env, argv, volumes)
            for i, c in enumerate((spec.get("containers") or [])[1:], start=1):
                c_env = self.container_env(pod, c, p.ip)
                c_argv = [expand(a, c_env) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
                if not c_argv:
                    raise ConfigError(f"containers[{i}].command: empty, and no image is pulled to give an entrypoint")
                extra.append((c, c_env, c_argv, self._volumes(pod, c, podir)))
        except ConfigError as e:
            p.waiting = ("CreateContainerConfigError", str(e))
            return p
        p.env = env
        (podir / "hosts").write_text(self.hosts_file(pod, p.ip))
        (podir / "resolv.conf").write_text(self.resolv_conf(meta["namespace"]))
        message_path = container.get("terminationMessagePath", "/dev/termination-log")
        p.message_path = podir / "termination-log"
        p.message_path.touch()
        p.fallback = container.get("terminationMessagePolicy") == "FallbackToLogsOnError"
        p.cgroup = self.cgroups / f"p{slot}"
        p.cgroup.mkdir()
        limit = ((container.get("resources") or {}).get("limits") or {}).get("memory")
        if limit:
            (p.cgroup / "memory.limit_in_bytes").write_text(str(quantity_bytes(limit)))
        hostname = spec.get("hostname") or meta["name"]
        sandbox = [
            "bwrap",
            "--bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            *image_binds(),
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-ipc",
            "--hostname",
            hostname,
            "--as-pid-1",
            "--die-with-parent",
            "--ro-bind",
            str(podir / "hosts"),
            "/etc/hosts",
            "--ro-bind",
            str(podir / "resolv.conf"),
            "/etc/resolv.conf",
            "--bind",
            str(p.message_path),
            message_path,
            *volumes,
            "--chdir",
            container.get("workingDir") or self.config.workdir,
            "--",
            *argv,
        ]
        # the shell joins the pod's cgroup, then becomes nsenter, which becomes bubblewrap
        launcher = [
            "sh",
            "-c",
            'echo $$ > "$0" && exec "$@"',
            str(p.cgroup / "cgroup.procs"),
            "nsenter",
            f"--net=/run/netns/{p.netns}",
            *sandbox,
        ]
        hosts = sandbox.index(str(podir / "hosts")) - 1  # the sidecars share the sandbox up to here
        for c, c_env, c_argv, c_volumes in extra:
            c_sandbox = [
                *sandbox[:hosts],
                *sandbox[hosts : hosts + 6],  # /etc/hosts and /etc/resolv.conf
                *c_volumes,
                "--chdir",
                c.get("workingDir") or self.config.workdir,
                "--",
                *c_argv,
            ]
            name = str(c.get("name", f"c{len(p.sidecars) + 1}"))
            p.sidecars.append(
                Sidecar(name, [*launcher[: launcher.index("nsenter") + 2], *c_sandbox], c_env, podir / f"{name}.log")
            )
        if pull_s > 0:
            p.waiting = ("ContainerCreating", f"pulling the image (this node's pulls take {pull_s:g} s)")
            pull = threading.Thread(target=self._pull_then_exec, args=(p, launcher, env, pull_s), daemon=True)
            pull.start()  # a daemon: a "pull" longer than the test never holds the server's exit
        else:
            self._exec(p, launcher, env)
        return p

    def _pull_then_exec(self, p: PodProcess, launcher: list[str], env: dict[str, str], pull_s: float) -> None:
        """A slow node's "pull", then the container, started from this thread, which lives as
        long as the container: bubblewrap's ``--die-with-parent`` is the kernel's parent-death
        signal, sent when the *thread* that started the process ends (a thread that returned
        right after starting it SIGKILLed the container: exit -9, seen under load)."""
        time.sleep(pull_s)
        self._exec(p, launcher, env)
        if p.proc is not None:  # not when the pod was deleted during its "pull"
            p.ended.wait()

    def _exec(self, p: PodProcess, launcher: list[str], env: dict[str, str]) -> None:
        with self._lock:  # never start a container whose pod is being deleted
            if p.deleting:
                return
            p.proc = subprocess.Popen(
                launcher,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            p.started_at = time.time()
            p.waiting = None
            for c in p.sidecars:
                c.log.touch()
                c.proc = subprocess.Popen(
                    c.launcher,
                    env=c.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                c.started_at = time.time()
                threading.Thread(target=self._follow_sidecar, args=(c,), daemon=True, name=f"kubelet-{c.name}").start()
        threading.Thread(target=self._follow, args=(p,), daemon=True, name=f"kubelet-{p.name}").start()
        if p.probe is not None:
            threading.Thread(target=self._probe_loop, args=(p,), daemon=True, name=f"probe-{p.name}").start()
        self.on_start(p)

    def _probe_loop(self, p: PodProcess) -> None:
        """Run the container's readinessProbe until the container ends (see the module docstring)."""
        probe = p.probe or {}
        period = float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        to_ready, to_unready = int(probe.get("successThreshold", 1)), int(probe.get("failureThreshold", 3))
        passes = fails = 0
        if p.ended.wait(float(probe.get("initialDelaySeconds", 0))):
            return
        while not p.ended.is_set() and not p.deleting:
            ok = self._probe_once(p, probe, timeout)
            passes, fails = (passes + 1, 0) if ok else (0, fails + 1)
            # unready at first: the first failure is no transition, the first passes are
            if (not p.ready and passes >= to_ready) or (p.ready and fails >= to_unready):
                p.ready = not p.ready
                if not p.ended.is_set():
                    self.on_ready(p, p.ready)
            if p.ended.wait(period):
                return

    def _probe_once(self, p: PodProcess, probe: Mapping[str, Any], timeout: float) -> bool:
        argv = list((probe.get("exec") or {}).get("command") or [])
        pid = p.pid1(timeout=0.5)
        if not argv or pid is None:
            return False
        try:  # inside the pod, as `kubectl exec` would be (its root and working directory too)
            done = subprocess.run(
                [
                    "nsenter",
                    f"--target={pid}",
                    "--mount",
                    "--uts",
                    "--ipc",
                    "--net",
                    "--pid",
                    "--root",
                    "--wd",
                    "--",
                    *argv,
                ],
                env=p.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def _follow(self, p: PodProcess) -> None:
        """Copy the container's output to its log (each line timestamped), then record how it ended."""
        assert p.proc is not None and p.proc.stdout is not None
        with open(p.log, "ab", buffering=0) as log:
            for line in iter(p.proc.stdout.readline, b""):
                log.write(stamp().encode() + b" " + (line if line.endswith(b"\n") else line + b"\n"))
        code = p.proc.wait()
        oom = p.cgroup is not None and _oom_kills(p.cgroup) > 0
        p.exit_code = code
        p.reason = "OOMKilled" if oom and code == 137 else ("Completed" if code == 0 else "Error")
        p.message = self._message(p)
        p.finished_at = time.time()
        if p.sidecars:  # the pod runs on (phase Running) until its other containers end too
            self.on_main_end(p)
            p.main_ended.set()
            for c in p.sidecars:
                c.ended.wait()
        p.main_ended.set()
        self._teardown(p)
        p.ended.set()
        self.on_end(p)

    def _follow_sidecar(self, c: Sidecar) -> None:
        """A sidecar's output into its own log, then its exit code."""
        assert c.proc is not None and c.proc.stdout is not None
        with open(c.log, "ab", buffering=0) as log:
            for line in iter(c.proc.stdout.readline, b""):
                log.write(stamp().encode() + b" " + (line if line.endswith(b"\n") else line + b"\n"))
        c.exit_code = c.proc.wait()
        c.finished_at = time.time()
        c.ended.set()

    def _message(self, p: PodProcess) -> str | None:
        text = ""
        if p.message_path is not None and p.message_path.exists():
            with open(p.message_path, "rb") as f:
                text = f.read(MESSAGE_CAP).decode("utf-8", "replace")
        if not text and p.fallback and p.exit_code != 0:
            tail = p.log.read_bytes().splitlines()[-FALLBACK_LINES:]
            text = b"".join(line.split(b" ", 1)[-1] + b"\n" for line in tail)[-FALLBACK_BYTES:].decode(
                "utf-8", "replace"
            )
        return text or None

    def _teardown(self, p: PodProcess) -> None:
        """The sandbox goes when its last process ends: network namespace, cgroup."""
        self.network.detach(p.netns, p.slot)
        if p.cgroup is not None:
            _rmdir_cgroup(p.cgroup)

    def delete(self, uid: str, grace: float | None = None) -> None:
        """SIGTERM to the container's PID 1, SIGKILL after the grace period (in a thread)."""
        p = self.pods.get(uid)
        with self._lock:
            if p is None or p.deleting:
                return
            p.deleting = True
        if p.proc is None:  # never started: the sandbox alone goes
            self.network.detach(p.netns, p.slot)
            if p.cgroup is not None:
                _rmdir_cgroup(p.cgroup)
            p.ended.set()
            return
        wait = p.grace_s if grace is None else grace

        def stop() -> None:
            if wait > 0:
                p.signal(signal.SIGTERM)
            if not p.ended.wait(wait):
                p.signal(signal.SIGKILL)

        threading.Thread(target=stop, daemon=True, name=f"kubelet-stop-{p.name}").start()

    def kill(self, uid: str) -> None:
        """SIGKILL every process of the pod now (a lost node)."""
        p = self.pods.get(uid)
        if p is not None and p.cgroup is not None:
            _kill_cgroup(p.cgroup)

    def shutdown(self) -> None:
        """Kill every pod and remove the cluster's cgroups (the network goes separately)."""
        for p in list(self.pods.values()):
            if p.cgroup is not None:
                _kill_cgroup(p.cgroup)
        for p in list(self.pods.values()):
            p.ended.wait(5)
        remove_cgroups(self.cgroups)


def _oom_kills(cgroup: Path) -> int:
    with contextlib.suppress(OSError):
        for line in (cgroup / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    return 0


def _kill_cgroup(cgroup: Path) -> None:
    with contextlib.suppress(OSError):
        for pid in (cgroup / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _rmdir_cgroup(cgroup: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while cgroup.exists():
        try:
            cgroup.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                return
            _kill_cgroup(cgroup)
            time.sleep(0.05)


def remove_cgroups(root: Path) -> None:
    """Kill what is left in ``root``'s groups and remove them, children first."""
    if not root.exists():
        return
    for child in sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: -len(d.parts)):
        _rmdir_cgroup(child)
    _rmdir_cgroup(root)


def cleanup(prefix: str, root: Path | None = None) -> None:
    """Remove everything a cluster with ``prefix`` left (a crashed server): processes in its
    cgroups, its namespaces, its cgroups, its files under ``root``."""
    cgroups = memory_cgroup_root() / f"{prefix}pods"
    if cgroups.exists():
        for child in cgroups.iterdir():
            if child.is_dir():
                _kill_cgroup(child)
        remove_cgroups(cgroups)
    for name in list_netns():
        if name.startswith(prefix):
            run("ip", "netns", "del", name, check=False)
    if root is not None:
        shutil.rmtree(root / "pods", ignore_errors=True)
