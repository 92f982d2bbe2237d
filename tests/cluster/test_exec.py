"""``kubectl exec`` on the one-machine cluster (``tests/kubeexec.py``), through the official
Python client's ``kubernetes.stream.stream`` as the KubernetesPodOperator's XCom sidecar read
uses it: the command runs inside the pod (its hostname, files and environment), its stdout,
stderr, stdin and exit status travel over the WebSocket channels, and the errors are the API
server's (404 for an unknown pod, 400 for an unknown container or a finished pod)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cluster.harness import Cluster

kubernetes = pytest.importorskip("kubernetes")
from kubernetes.client.exceptions import ApiException  # noqa: E402
from kubernetes.stream import stream  # noqa: E402


@pytest.fixture(scope="module")
def core(module_cluster: Cluster) -> Iterator[Any]:
    from kubernetes import client, config

    api = config.new_client_from_config(str(module_cluster.kubeconfig))
    yield client.CoreV1Api(api)
    api.close()


def running_pod(cluster: Cluster, name: str, **container: Any) -> dict[str, Any]:
    """A pod that sleeps (so it can be entered), once it runs."""
    spec = {
        "restartPolicy": "Never",
        "hostname": name,
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "main",
                "image": "onemachine",
                "command": ["sh", "-c", "echo inside > /tmp/mark; sleep 300"],
                **container,
            }
        ],
    }
    made = cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})
    assert made.get("kind") == "Pod", made
    return dict(
        cluster.wait(lambda: (p := cluster.get("pods", name))["status"].get("phase") == "Running" and p, 60, name)
    )


def gone(cluster: Cluster, name: str) -> None:
    cluster.delete("pods", name)
    cluster.wait(lambda: cluster.get("pods", name).get("code") == 404, 60, f"pod {name} to go")


def test_exec_runs_the_command_inside_the_pod_and_returns_its_output(module_cluster: Cluster, core: Any) -> None:
    running_pod(module_cluster, "exec-a", env=[{"name": "GREETING", "value": "hello"}])
    try:
        out = stream(
            core.connect_get_namespaced_pod_exec,
            "exec-a",
            "ml",
            command=["sh", "-c", "hostname; cat /tmp/mark; echo $GREETING; echo pid1=$(cat /proc/1/comm)"],
            container="main",
            stdout=True,
            stderr=True,
            stdin=False,
            tty=False,
        )
        # its UTS namespace, its private /tmp (mount namespace), its environment, its PID namespace
        assert out.split("\n")[:4] == ["exec-a", "inside", "hello", "pid1=sh"], out
    finally:
        gone(module_cluster, "exec-a")


def test_exec_streams_stderr_stdin_and_the_exit_status(module_cluster: Cluster, core: Any) -> None:
    running_pod(module_cluster, "exec-b")
    try:
        resp = stream(
            core.connect_get_namespaced_pod_exec,
            "exec-b",
            "ml",
            command=["sh", "-c", "read line; echo got $line; echo oops >&2; exit 3"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
        resp.write_stdin("ping\n")
        resp.run_forever(timeout=30)
        assert resp.read_stdout() == "got ping\n"
        assert resp.read_stderr() == "oops\n"
        assert resp.returncode == 3  # from the v4 status channel (NonZeroExitCode)
        # the KubernetesPodOperator's sidecar kill: a shell fed on stdin that kills itself
        resp = stream(
            core.connect_get_namespaced_pod_exec,
            "exec-b",
            "ml",
            command=["/bin/sh"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )
        resp.write_stdin("echo bye; exit 0\n")
        resp.run_forever(timeout=30)
        assert resp.read_stdout() == "bye\n" and resp.returncode == 0
    finally:
        gone(module_cluster, "exec-b")


def test_exec_leaves_no_process_behind_when_the_client_goes(module_cluster: Cluster, core: Any) -> None:
    running_pod(module_cluster, "exec-c")
    try:
        resp = stream(
            core.connect_get_namespaced_pod_exec,
            "exec-c",
            "ml",
            command=["sleep", "123"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
        )

        def started_or_ended() -> bool:
            if _pod_has("exec-c", module_cluster, "123"):
                return True
            resp.update(timeout=0.1)
            return not resp.is_open()

        module_cluster.wait(started_or_ended, 30, "the exec'd sleep to run")
        # an exec that ended at once says why (its stderr and its status channel)
        assert _pod_has("exec-c", module_cluster, "123"), (resp.read_stderr(), resp.read_channel(3))
        resp.close()
        module_cluster.wait(lambda: not _pod_has("exec-c", module_cluster, "123"), 30, "the exec'd sleep to end")
    finally:
        gone(module_cluster, "exec-c")


def _pod_has(name: str, cluster: Cluster, arg: str) -> bool:
    """Whether a process of the cluster's pods runs ``sleep <arg>``."""
    for pid in cluster.pod_processes():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().split(b"\0")[:2] == [b"sleep", arg.encode()]:
                    return True
        except OSError:
            continue
    return False


def test_exec_errors_are_the_api_servers(module_cluster: Cluster, core: Any) -> None:
    def status_of(name: str, **kw: Any) -> str:
        with pytest.raises(ApiException) as raised:
            stream(
                core.connect_get_namespaced_pod_exec,
                name,
                "ml",
                command=["true"],
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                **kw,
            )
        return str(raised.value)  # the client says the handshake's status and the Status body

    assert "404" in status_of("no-such-pod")
    running_pod(module_cluster, "exec-d")
    try:
        said = status_of("exec-d", container="sidecar")
        assert "400" in said and "container sidecar is not valid for pod exec-d" in said
    finally:
        gone(module_cluster, "exec-d")
    done = module_cluster.exec_pod(["true"], name="exec-e")
    assert done["status"]["phase"] == "Succeeded"
    said = status_of("exec-e")
    assert "400" in said and "completed pod" in said
    module_cluster.delete("pods", "exec-e")
    module_cluster.wait(lambda: not module_cluster.pod_processes(), 60, "every pod process to end")


def test_a_sidecar_keeps_the_pod_running_after_the_first_container_and_exec_reads_their_shared_volume(
    module_cluster: Cluster, core: Any
) -> None:
    """The KubernetesPodOperator's XCom protocol, as its pod manager runs it: the main
    container writes the result into a shared emptyDir and exits; the sidecar keeps the pod
    Running; an exec into the sidecar reads the file, another one makes it exit; then the pod
    has Succeeded."""
    mount = [{"name": "xcom", "mountPath": "/airflow/xcom"}]
    spec = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "xcom", "emptyDir": {}}],
        "containers": [
            {
                "name": "main",
                "image": "onemachine",
                "volumeMounts": mount,
                "command": ["sh", "-c", "echo '{\"ok\": 1}' > /airflow/xcom/return.json"],
            },
            {
                "name": "airflow-xcom-sidecar",
                "image": "alpine",
                "volumeMounts": mount,
                "command": ["sh", "-c", 'trap "exit 0" INT; while true; do sleep 1; done;'],
            },
        ],
    }
    made = module_cluster.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "xcom-a"}, "spec": spec})
    assert made.get("kind") == "Pod", made

    def main_done() -> Any:
        pod = module_cluster.get("pods", "xcom-a")
        states = {c["name"]: c["state"] for c in pod["status"].get("containerStatuses") or []}
        return "terminated" in states.get("main", {}) and pod

    pod = module_cluster.wait(main_done, 60, "the main container to end")
    states = {c["name"]: c["state"] for c in pod["status"]["containerStatuses"]}
    assert pod["status"]["phase"] == "Running" and "running" in states["airflow-xcom-sidecar"], pod["status"]
    assert states["main"]["terminated"]["exitCode"] == 0
    read = stream(  # as the pod manager reads it (unparsed: the client would parse JSON output)
        core.connect_get_namespaced_pod_exec,
        "xcom-a",
        "ml",
        container="airflow-xcom-sidecar",
        command=["/bin/sh", "-c", "if [ -s /airflow/xcom/return.json ]; then cat /airflow/xcom/return.json; fi"],
        stdin=False,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    read.run_forever(timeout=30)
    assert read.read_all() == '{"ok": 1}\n'
    resp = stream(
        core.connect_get_namespaced_pod_exec,
        "xcom-a",
        "ml",
        container="airflow-xcom-sidecar",
        command=["/bin/sh"],
        stdin=True,
        stdout=True,
        stderr=True,
        tty=False,
        _preload_content=False,
    )
    resp.write_stdin("kill -2 $(pgrep -u $(id -u) -f 'sh')\n")
    resp.run_forever(timeout=30)
    done = module_cluster.pod_done("xcom-a", 60)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert [c["state"]["terminated"]["exitCode"] for c in done["status"]["containerStatuses"]] == [0, 0]
    gone(module_cluster, "xcom-a")
