"""The API faults both fake API servers answer (``tests/kubehttp.py``'s scripted cluster and
``tests/cluster``'s real one): a status for the next N matching requests, cut log streams."""

from __future__ import annotations

from typing import Any


class ApiFaults:
    """Mixin: the holder sets ``lock``, ``counters``, ``answer`` (None) and ``cut_logs`` (0)."""

    lock: Any
    counters: dict[str, int]
    answer: dict[str, Any] | None
    cut_logs: int

    def arm_faults(self, body: dict[str, Any]) -> None:
        """Arm what ``POST /debug/fault`` asks for (``status``..., ``cut_logs``); the caller holds the lock."""
        if "status" in body:
            self.answer = {
                "status": int(body["status"]),
                "count": int(body.get("count", 1)),
                "retry_after": body.get("retry_after"),
                "match": body.get("match"),
                "methods": body.get("methods"),
            }
        if "cut_logs" in body:
            self.cut_logs += int(body["cut_logs"])

    def answered(self, method: str, path: str) -> tuple[int, float | None] | None:
        """The status an armed fault answers this request with (it counts one), or None."""
        with self.lock:
            a = self.answer
            if a is None or a["count"] <= 0 or (a["match"] and a["match"] not in path):
                return None
            if a["methods"] and method not in a["methods"]:
                return None
            a["count"] -= 1
            self.counters["faults_answered"] += 1
            return a["status"], a["retry_after"]

    def cut(self) -> bool:
        """Whether a followed log stream that sent a line is to be cut now (it counts one)."""
        with self.lock:
            if self.cut_logs <= 0:
                return False
            self.cut_logs -= 1
            self.counters["streams_cut"] += 1
            return True
