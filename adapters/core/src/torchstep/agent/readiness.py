"""The agent's readiness file: present while this node's workers run in a formed gang.

A Kubernetes readinessProbe, and through it Kueue's ``waitForPodsReady``, needs to know when a
pod is really running its part of the job. A container that merely started is not: its agent
may wait in the rendezvous for minutes (a peer not scheduled, an image still pulling). So the
agent writes a file whose presence means *the rendezvous completed and this node's workers
were started* (the gang formed), and the rendered pods of a multi-replica role probe for it
(``torchstep.kubernetes``; docs/kubernetes.md, "Readiness and waitForPodsReady").

When the file exists:

- written once the workers of a group start (after the rendezvous formed the world);
- removed when the agent stops the group (a failure restart, a membership change, a
  signal): a node back in the rendezvous is not ready until the new world forms; with
  Kueue's ``recoveryTimeout`` a gang that cannot form again is evicted and requeued;
- removed when the agent exits.

Where: the path in ``TORCHSTEP_READY_FILE`` (the rendered pods set it); unset, the agent
writes none. Writing never fails the run: an unwritable path is one warning, and the probe
simply keeps the pod unready.

Example::

    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "ready")
    >>> ready = ReadyFile(path)
    >>> ready.mark(); os.path.exists(path)
    True
    >>> ready.clear(); os.path.exists(path)
    False
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping

from torchstep.contract import ENV_READY_FILE

__all__ = ["ReadyFile"]

log = logging.getLogger("torchstep.agent")


class ReadyFile:
    """The readiness file at ``path`` (``None``: readiness is not asked for, nothing is written).

    Args:
        path: where the file goes, or ``None``.
    """

    def __init__(self, path: str | None) -> None:
        self.path = path or None
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ReadyFile:
        """The readiness file named by ``TORCHSTEP_READY_FILE``.

        Args:
            env: the environment to read; ``None``: ``os.environ``.

        Returns:
            The readiness file (inactive when the variable is unset or empty).
        """
        return cls((os.environ if env is None else env).get(ENV_READY_FILE))

    def mark(self) -> None:
        """Say "ready": write the file (atomically: a probe never reads half of it)."""
        if self.path is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            # a file of our own, never through a link someone else planted
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(f"{time.time():.3f}\n")
            os.replace(tmp, self.path)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if not self._warned:
                self._warned = True
                log.warning(
                    "cannot write the readiness file %s (%s): this pod will not turn Ready; "
                    "fix: point %s at a writable path (an emptyDir)",
                    self.path,
                    e.strerror or e,
                    ENV_READY_FILE,
                )

    def clear(self) -> None:
        """Say "not ready": remove the file (nothing when there is none)."""
        if self.path is None:
            return
        with contextlib.suppress(FileNotFoundError, OSError):
            os.unlink(self.path)
