"""The local target's mount policy: there is no container, so a mount is served by the
host path itself.

* ``BindMount(src, dst)`` / ``DeviceMount(src, dst)`` with ``src == dst``: used as is.
* ``src != dst``: every occurrence of the path ``dst`` in the role's entrypoint, args
  (inside ``bash -c`` strings too) and env values is rewritten to ``src``. A path is
  matched whole: ``/data`` matches ``/data`` and ``/data/x`` but not ``/data2`` or ``/x/data``.
  Arguments stay an argv list: a path reaches the worker verbatim, whatever it holds. Only
  code that an interpreter evaluates (``bash -c SCRIPT``, ``python -c CODE``) could read
  a path as code, so a ``src`` with characters outside ``[A-Za-z0-9_@%+=:,./-]`` is refused
  there (a SpecError naming the mount) rather than pasted into the code.
* ``read_only`` cannot be enforced without a container: it is advisory.
* Refused with a :class:`~torchstep.SpecError` naming the mount, before any process
  starts: a source that does not exist on this machine, a device mount whose source is not
  a device (``build_plan`` already refuses a ``VolumeMount`` and a mount onto ``/``).

Example::

    >>> from torchstep.local.mounts import rewrite
    >>> rewrite("--data=/data/train --out /data2", [("/data", "/mnt/ds")])
    '--data=/mnt/ds/train --out /data2'
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
from collections.abc import Sequence

from torchstep.errors import SpecError
from torchstep.plan.cmdline import script_index
from torchstep.plan.model import RolePlan

TARGET = "local"


def rewrites_of(role: RolePlan, index: int) -> list[tuple[str, str]]:
    """The ``(dst, src)`` rewrites of ``role`` (``index`` = its position in the AppDef),
    after checking that this machine can serve every mount.

    Args:
        role: the role's plan.
        index: its position in the AppDef (for field paths).

    Returns:
        ``(container path, host path)`` pairs.

    Raises:
        SpecError: a mount this machine cannot serve (a source path that does not exist, a
            device path that is not a device).
    """
    out = []
    for j, m in enumerate(role.mounts):
        # the planner already refused what no machine can serve (a PVC, a mount onto /);
        # what this machine has is checked here
        field = f"roles[{index}].mounts[{j}]"
        try:
            st = os.stat(m.src)
        except OSError:
            raise SpecError(
                f"{field}.src_path",
                TARGET,
                f"{m.src} does not exist on this machine",
                fix="create it, or point the mount at an existing host path",
            ) from None
        if m.kind == "device" and not (stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)):
            raise SpecError(f"{field}.src_path", TARGET, f"{m.src} is not a device", fix="mount a /dev/... path")
        dst = os.path.normpath(m.dst)
        src = os.path.normpath(m.src)
        if dst != src:
            out.append((dst, src))
    return out


def rewrite(text: str, rewrites: Sequence[tuple[str, str]]) -> str:
    """Replace each whole path ``dst`` (and its sub-paths) in ``text`` by ``src``.

    Args:
        text: an arg or env value.
        rewrites: ``(dst, src)`` pairs from :func:`rewrites_of`.

    Returns:
        The rewritten text.
    """
    if not rewrites or "/" not in text:
        return text
    by_dst = dict(rewrites)
    alternatives = "|".join(re.escape(d) for d in sorted(by_dst, key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.\-/])({alternatives})(?![\w.\-])")
    return pattern.sub(lambda m: by_dst[m.group(1)], text)


#: What a shell (or Python) reads as one plain word: the characters ``shlex.quote`` leaves alone.
_PLAIN_PATH = re.compile(r"[\w@%+=:,./-]+", re.ASCII)


def apply(role: RolePlan, index: int) -> RolePlan:
    """``role`` with its mount destinations rewritten to host paths (see module docstring).

    Args:
        role: the role's plan.
        index: its position in the AppDef.

    Returns:
        The role's plan with args and env rewritten.

    Raises:
        SpecError: a mount this machine cannot serve.
    """
    rw = rewrites_of(role, index)
    if not rw:
        return role
    script = script_index(role.entrypoint, role.args)
    if script is not None:
        code = role.args[script]
        for j, m in enumerate(role.mounts):
            src, dst = os.path.normpath(m.src), os.path.normpath(m.dst)
            if src != dst and not _PLAIN_PATH.fullmatch(src) and rewrite(code, [(dst, "\0")]) != code:
                raise SpecError(
                    f"roles[{index}].mounts[{j}].src_path",
                    TARGET,
                    f"{src!r} would be pasted into the code of `{os.path.basename(role.entrypoint)} -c`, "
                    "where its shell characters would run as code",
                    fix="use a host path of letters, digits and _@%+=:,./- only, or mount it at the same path "
                    "(src_path == dst_path) so nothing is rewritten",
                )
    return dataclasses.replace(
        role,
        entrypoint=rewrite(role.entrypoint, rw),
        args=tuple(rewrite(a, rw) for a in role.args),
        env={k: rewrite(v, rw) for k, v in role.env.items()},
    )
