"""Moved to :mod:`torchstep.schedulers.prefect` in 0.3: ``torchx run -s prefect`` talks to
Prefect's REST API only, so submitting needs ``torchstep`` and no Prefect install. This
alias warns and goes in 0.4."""

from torchstep.lazy import moved_module

moved_module(__name__, "torchstep.schedulers.prefect", since="0.3")
