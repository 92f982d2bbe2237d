"""Moved to :mod:`torchstep.schedulers.airflow` in 0.3: ``torchx run -s airflow`` talks to
Airflow's REST API only, so submitting needs ``torchstep`` and no Airflow install. This
alias warns and goes in 0.4."""

from torchstep.lazy import moved_module

moved_module(__name__, "torchstep.schedulers.airflow", since="0.3")
