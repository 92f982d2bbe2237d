"""What a pod is made of, executed: every pod of the one-machine cluster runs for real in its
own network, UTS, PID and mount namespaces, with its memory limit, volumes, cluster DNS,
termination message and log — the things a rendered object relies on and the scripted fake
API server only pretended."""

from __future__ import annotations

import time
from pathlib import Path

from cluster.harness import Cluster


def sh(script: str) -> list[str]:
    """A container command; ``$$`` is Kubernetes' escape of ``$`` (``$(VAR)`` is expanded)."""
    return ["sh", "-c", script]


def log_text(cluster: Cluster, pod: str) -> str:
    return cluster.log(pod)


def terminated(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def test_a_pod_has_its_own_pid_1_hostname_hosts_file_address_and_resolver(real_cluster: Cluster) -> None:
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "sub"},
            "spec": {"clusterIP": "None", "selector": {"app": "box"}},
        }
    )
    pod = real_cluster.exec_pod(
        sh(
            "echo pid=$$$$; hostname; grep box /etc/hosts; cat /etc/resolv.conf; ip -o -4 addr show;"
            " echo links: `ip -o link show | cut -d: -f2 | cut -d@ -f1`"
        ),
        name="box-7",
        hostname="box",
        subdomain="sub",
    )
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    out = log_text(real_cluster, "box-7")
    ip = pod["status"]["podIP"]
    assert ip.startswith("10.244.") and ip != "10.244.0.1"
    assert "pid=1\n" in out  # the container's first process is PID 1
    assert "\nbox\n" in out  # hostname = spec.hostname
    assert f"{ip}\tbox.sub.ml.svc.cluster.local\tbox" in out  # kubelet's FQDN line
    assert "search ml.svc.cluster.local svc.cluster.local cluster.local" in out
    assert "nameserver 10.244.0.1" in out
    # only its own loopback and its veth: none of the machine's interfaces
    assert "links: lo eth0\n" in out, out
    assert f"inet {ip}/16" in out and "127.0.0.1/8" in out


def test_cluster_dns_answers_a_headless_services_pod_names_and_nothing_else(real_cluster: Cluster) -> None:
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "grp"},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "grp"}},
        }
    )
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "peer", "labels": {"app": "grp"}},
            "spec": {
                "hostname": "peer",
                "subdomain": "grp",
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "x", "command": ["sleep", "60"]}],
            },
        }
    )
    peer = real_cluster.wait(lambda: real_cluster.get("pods", "peer")["status"].get("podIP"), 30, "peer's IP")
    # another pod resolves the peer by FQDN, by the search path, and the Service name; an
    # outside name is refused (the resolver has no upstream: nothing leaves the cluster)
    pod = real_cluster.exec_pod(
        sh(
            "getent hosts peer.grp.ml.svc.cluster.local; getent hosts peer.grp; getent hosts grp.ml.svc.cluster.local;"
            " getent hosts example.com || echo outside-unresolved"
        )
    )
    out = log_text(real_cluster, pod["metadata"]["name"])
    assert out.count(peer) == 3, out
    assert "peer.grp.ml.svc.cluster.local" in out and "outside-unresolved" in out
    real_cluster.delete("pods", "peer", gracePeriodSeconds=0)


def test_env_is_expanded_as_kubernetes_does_with_the_downward_api(real_cluster: Cluster) -> None:
    env = [
        {"name": "A", "value": "x"},
        {"name": "B", "value": "$(A)-y"},
        {"name": "C", "value": "$$(A)"},
        {"name": "D", "value": "$(UNDEFINED)"},
        {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "IDX", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['k/i']"}}},
    ]
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "envy", "annotations": {"k/i": "3"}},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "command": ["sh", "-c", 'echo "$B|$C|$D|$NAME|$NS|$IP|$IDX|$(A)"'],
                        "env": env,
                    }
                ],
            },
        }
    )
    pod = real_cluster.pod_done("envy")
    assert log_text(real_cluster, "envy").strip() == f"x-y|$(A)|$(UNDEFINED)|envy|ml|{pod['status']['podIP']}|3|x"


def test_exceeding_the_memory_limit_is_oomkilled_137(real_cluster: Cluster) -> None:
    pod = real_cluster.exec_pod(
        ["python3", "-c", "import time; x = bytearray(400 * 2**20); time.sleep(5); print('survived')"],
        container={"resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}}},
    )
    assert pod["status"]["phase"] == "Failed"
    assert terminated(pod)["exitCode"] == 137 and terminated(pod)["reason"] == "OOMKilled"
    assert "survived" not in log_text(real_cluster, pod["metadata"]["name"])


def test_deleting_a_pod_sends_sigterm_then_sigkill_after_the_grace_period(real_cluster: Cluster) -> None:
    stubborn = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: print('got SIGTERM', flush=True))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    polite = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('bye', flush=True), sys.exit(143)))\n"
        "print('ready', flush=True)\n"
        "while True: time.sleep(0.1)\n"
    )
    for name, code in (("stubborn", stubborn), ("polite", polite)):
        real_cluster.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{"name": "main", "image": "x", "command": ["python3", "-c", code]}],
                },
            }
        )
    for name in ("stubborn", "polite"):
        real_cluster.wait(lambda n=name: "ready" in real_cluster.log(n), 60, f"{name} to start")
    t0 = time.monotonic()
    real_cluster.delete("pods", "stubborn")
    real_cluster.delete("pods", "polite")
    # a deleted pod stays, terminating, until its processes are gone
    assert "deletionTimestamp" in real_cluster.get("pods", "stubborn")["metadata"]
    real_cluster.wait(lambda: real_cluster.get("pods", "polite").get("code") == 404, 30, "polite to go")
    polite_s = time.monotonic() - t0
    real_cluster.wait(lambda: real_cluster.get("pods", "stubborn").get("code") == 404, 60, "stubborn to go")
    stubborn_s = time.monotonic() - t0
    assert polite_s < 5 <= stubborn_s, (polite_s, stubborn_s)  # SIGKILL only after the grace period
    events = real_cluster.items("events")
    assert any(e["reason"] == "Killing" and e["involvedObject"]["name"] == "stubborn" for e in events)
    exits = [
        e["message"]
        for e in events
        if e["involvedObject"]["name"] in ("stubborn", "polite") and e["reason"] == "Failed"
    ]
    assert any("exited 137" in m for m in exits) and any("exited 143" in m for m in exits), exits


def test_volumes_are_mounted_at_their_paths_read_only_where_asked(real_cluster: Cluster, tmp_path: Path) -> None:
    host = tmp_path / "host"
    host.mkdir()
    (host / "in.txt").write_text("from the node\n")
    volumes = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Mi"}},
        {"name": "data", "hostPath": {"path": str(host), "type": "Directory"}},
        {"name": "ro", "hostPath": {"path": str(host), "type": "Directory"}},
        {"name": "claim", "persistentVolumeClaim": {"claimName": "ckpt"}},
    ]
    mounts = [
        {"name": "scratch", "mountPath": "/scratch"},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "data", "mountPath": "/data"},
        {"name": "ro", "mountPath": "/ro", "readOnly": True},
        {"name": "claim", "mountPath": "/ckpt"},
    ]
    script = (
        "cat /data/in.txt; echo written > /data/out.txt; touch /ro/x 2>/dev/null || echo ro-refused;"
        " df -k /dev/shm | tail -1; echo saved > /ckpt/step; touch /scratch/ok && echo scratch-ok"
    )
    first = real_cluster.exec_pod(sh(script), name="vols", volumes=volumes, container={"volumeMounts": mounts})
    out = log_text(real_cluster, "vols")
    assert first["status"]["phase"] == "Succeeded", out
    assert "from the node" in out and "ro-refused" in out and "scratch-ok" in out
    assert (host / "out.txt").read_text() == "written\n" and not (host / "x").exists()
    shm_kib = int(next(line for line in out.splitlines() if "/dev/shm" in line or "tmpfs" in line).split()[1])
    assert shm_kib == 32 * 1024  # medium: Memory with its sizeLimit
    # the claim is one directory: a second pod reads what the first wrote there
    second = real_cluster.exec_pod(
        sh("cat /ckpt/step"), name="vols2", volumes=[volumes[-1]], container={"volumeMounts": [mounts[-1]]}
    )
    assert second["status"]["phase"] == "Succeeded" and log_text(real_cluster, "vols2") == "saved\n"


def test_termination_message_and_log_as_kubelet_writes_them(real_cluster: Cluster) -> None:
    big = real_cluster.exec_pod(
        sh("python3 -c \"print('m' * 6000, end='')\" > /dev/termination-log; echo one; exit 4"), name="big"
    )
    assert terminated(big)["exitCode"] == 4 and terminated(big)["message"] == "m" * 4096  # capped as kubelet
    fallback = real_cluster.exec_pod(
        sh("echo first; echo the cause >&2; exit 2"),
        name="fallback",
        container={"terminationMessagePolicy": "FallbackToLogsOnError"},
    )
    assert terminated(fallback)["message"] == "first\nthe cause\n"  # the log's tail when the file is empty
    custom = real_cluster.exec_pod(
        sh("echo custom > /tmp/why"), name="custom", container={"terminationMessagePath": "/tmp/why"}
    )
    assert terminated(custom)["message"] == "custom\n"
    stamped = real_cluster.log("big", "?timestamps=true").splitlines()
    assert len(stamped) == 1 and stamped[0].endswith("Z one") and stamped[0][:4].isdigit()
    # follow streams lines as they are written; sinceTime leaves out what came before
    real_cluster.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "ticker"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "command": sh("for i in 1 2 3 4 5 6; do echo tick $$i; sleep 0.5; done"),
                    }
                ],
            },
        }
    )
    real_cluster.wait(lambda: real_cluster.get("pods", "ticker")["status"].get("phase") == "Running", 30)
    followed = real_cluster.log("ticker", "?follow=true")
    assert followed.splitlines() == [f"tick {i}" for i in range(1, 7)]
    lines = real_cluster.log("ticker", "?timestamps=true").splitlines()
    since = lines[3].split()[0][:19] + "Z"
    later = real_cluster.log("ticker", f"?sinceTime={since}").splitlines()
    assert later and later[-1] == "tick 6" and "tick 1" not in later
