"""The surfaces a soak run goes through. Each module has ``NAME``, ``FAULTS`` (the fault
classes it can inject) and ``run(run, seed, workdir) -> Observation``."""

from __future__ import annotations

#: Surfaces of the issue not driven by the campaign yet (docs/reliability.md says so).
NOT_COVERED: dict[str, str] = {}
