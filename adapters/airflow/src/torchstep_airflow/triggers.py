"""The trigger a deferred ``AppDefOperator(target="kubernetes", deferrable=True)`` waits on
when its app runs as Jobs (several replicas or roles): :class:`JobGangTrigger`.

The worker creates the run's Jobs (attach or create, recorded in the task state store as
the non-deferred path does), then defers; this trigger runs in Airflow's triggerer and
polls the run's state through its JSON handle (:func:`torchstep.adapter.kubernetes.handle_of`):
each poll is one round of blocking reads of the Kubernetes client, run in a thread
(``asyncio.to_thread``) so the triggerer's event loop never blocks. The state is decided by
core (:class:`torchstep.adapter.kubernetes.RemoteRun`: the watcher's rules, preemptions
counted against ``preemption_retries``). It fires one event, and a worker resumes the task
in ``execute_complete``:

- ``{"status": "succeeded" | "failed" | "preempted", ...}``: the run ended;
- ``"gone"``: a workload was deleted or replaced while nobody watched;
- ``"bare_pod"``: a bare Pod was preempted (the worker creates it again and watches on);
- ``"timeout"``: the task's ``execution_timeout`` ran out (the worker deletes the run);
- ``"error"``: the Kubernetes API failed for longer than :data:`API_PATIENCE_S`.

Every event carries ``run_id`` (the try's run id, whose Jobs the worker reattaches to),
``handle``, ``message`` and the preemptions seen (``preempted_pods`` by uid, ``evictions``).
When a user marks the deferred task failed, succeeded or clears it, :meth:`JobGangTrigger.on_kill`
deletes the run's objects (as ``on_kill`` does on a worker); a triggerer restart does not.

The cluster is reached as the operator reaches it: the ``KubernetesHook`` of
``kubernetes_conn_id`` / ``in_cluster`` / ``config_file`` / ``cluster_context`` (so the
triggerer needs that connection or file too). Importing this module imports neither the
provider nor the Kubernetes client (``run()`` does).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

#: Seconds of consecutive failed polls (API errors) before the trigger hands the run back to
#: a worker (``"error"``), which then watches it with the usual retries of each call.
API_PATIENCE_S = 300.0
#: The ``KubernetesHook`` arguments the trigger takes from the operator's ``kubernetes_kwargs``.
CONN_KEYS = ("kubernetes_conn_id", "in_cluster", "config_file", "cluster_context")


class JobGangTrigger(BaseTrigger):
    """Wait in the triggerer for the Jobs of one try of a deferred ``AppDefOperator``.

    Args:
        run_id: the try's run id (the Jobs' names are a hash of it).
        handle: the run's JSON handle (:func:`torchstep.adapter.kubernetes.handle_of`).
        conn: how to reach the cluster: any of :data:`CONN_KEYS` (JSON values).
        poll_interval: seconds between two polls.
        deadline: unix time when the task's ``execution_timeout`` runs out (a ``"timeout"``
            event then), or ``None``.

    Raises:
        ValueError: a ``conn`` key outside :data:`CONN_KEYS`, or a poll interval that is
            not positive.
    """

    def __init__(
        self,
        *,
        run_id: str,
        handle: Mapping[str, Any],
        conn: Mapping[str, Any] | None = None,
        poll_interval: float = 2.0,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        unknown = sorted(set(conn or {}) - set(CONN_KEYS))
        if unknown:
            raise ValueError(f"JobGangTrigger conn: unknown key {unknown[0]!r}; use only {', '.join(CONN_KEYS)}")
        if not float(poll_interval) > 0:
            raise ValueError(f"JobGangTrigger poll_interval must be positive, got {poll_interval!r}")
        self.run_id = run_id
        self.handle = dict(handle)
        self.conn = dict(conn or {})
        self.poll_interval = float(poll_interval)
        self.deadline = deadline
        self._remote: Any = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The class path and the JSON keyword arguments that make this trigger again.

        Returns:
            ``("torchstep_airflow.triggers.JobGangTrigger", kwargs)``.
        """
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "run_id": self.run_id,
                "handle": self.handle,
                "conn": self.conn,
                "poll_interval": self.poll_interval,
                "deadline": self.deadline,
            },
        )

    def remote(self) -> Any:
        """The run as :class:`torchstep.adapter.kubernetes.RemoteRun`, its client the
        ``KubernetesHook``'s (blocking: call it in a thread).

        Returns:
            The :class:`~torchstep.adapter.kubernetes.RemoteRun`, the same on every call.
        """
        if self._remote is None:
            from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
            from torchstep.adapter.kubernetes import OfficialClient, RemoteRun

            kwargs = {k: v for k, v in self.conn.items() if k != "kubernetes_conn_id"}
            hook = KubernetesHook(
                conn_id=self.conn.get("kubernetes_conn_id", KubernetesHook.default_conn_name), **kwargs
            )
            client = OfficialClient(core=hook.core_v1_client, batch=hook.batch_v1_client, api_client=hook.api_client)
            self._remote = RemoteRun(self.handle, client, say=lambda text: self.log.info("%s", text))
        return self._remote

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Poll until the run ends, a worker is needed, or the deadline; one event.

        Yields:
            One :class:`TriggerEvent` (see the module docstring).
        """
        failing_since: float | None = None
        last: dict[str, Any] = {"preempted_pods": {}, "evictions": 0}
        while True:
            if self.deadline is not None and time.time() >= self.deadline:
                yield self._event("timeout", last, "the task's execution_timeout ran out while it waited")
                return
            try:
                remote = await asyncio.to_thread(self.remote)
                look = await asyncio.to_thread(remote.look)
            except Exception as e:  # the API (or the connection) failed: patiently, then a worker decides
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                self.log.warning("torchstep: reading the run %s: %s", self.run_id, e)
                if now - failing_since >= API_PATIENCE_S:
                    yield self._event("error", last, f"the Kubernetes API failed for {API_PATIENCE_S:.0f} s: {e}")
                    return
            else:
                failing_since = None
                last = look
                state = str(look["state"]).lower()
                if state != "running":
                    yield self._event(state, look, _message(state, look))
                    return
            await self._sleep()

    async def _sleep(self) -> None:
        wait = self.poll_interval
        if self.deadline is not None:
            wait = max(0.0, min(wait, self.deadline - time.time()))
        await asyncio.sleep(wait)

    async def on_kill(self) -> None:
        """The user marked the deferred task failed or succeeded, or cleared it: delete
        the run's objects (as ``AppDefOperator.on_kill`` does on a worker)."""
        remote = await asyncio.to_thread(self.remote)
        await asyncio.to_thread(remote.delete)
        self.log.warning("torchstep: task killed while deferred: deleted the objects of %s", self.run_id)

    def _event(self, status: str, look: Mapping[str, Any], message: str) -> TriggerEvent:
        pods = look.get("preempted_pods") or {}
        return TriggerEvent(
            {
                "status": status,
                "run_id": self.run_id,
                "handle": self.handle,
                "workload": look.get("workload"),
                "message": message,
                "preempted_pods": dict(pods),
                "evictions": int(look.get("evictions") or 0),
            }
        )


def _message(state: str, look: Mapping[str, Any]) -> str:
    if state == "gone":
        return f"{look.get('workload')} was deleted (or replaced by another object) while the task was deferred"
    if state == "bare_pod":
        return f"pod {look.get('workload')} was preempted; a worker creates it again"
    return f"the run ended: {state}"
