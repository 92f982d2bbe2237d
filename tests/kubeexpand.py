"""Kubernetes' ``$(VAR)`` expansion of a container's command, args and env values, as the
kubelet does it: one copy for the offline checks (tests/kubernetes) and the one-machine
cluster's kubelet (tests/cluster)."""

from __future__ import annotations

from collections.abc import Mapping


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (third_party/forked/golang/expansion): ``$(NAME)`` →
    its value when defined, else kept as written; ``$$`` → ``$``."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else f"$({name})")
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)
