"""TorchX schedulers backed by torchstep: ``torchx run -s torchstep_local|airflow|prefect|kfp``.

The core holds what every such scheduler needs — the private record of what was submitted
(:mod:`~torchstep.schedulers.records`), the chassis: errors, option rules, base class, state
mapping and log rules (:mod:`~torchstep.schedulers.base`), the REST client of the Airflow
and Prefect schedulers (:mod:`~torchstep.schedulers.rest`), the re-registration of TorchX's own schedulers
(:mod:`~torchstep.schedulers.builtins`) — and the ``torchstep_local`` scheduler itself
(:mod:`~torchstep.schedulers.local`). The orchestrator schedulers live in their adapters
(``torchstep_airflow.torchx_scheduler``, ``torchstep_prefect.torchx_scheduler``,
``torchstep_kfp.torchx_scheduler``). See ``docs/torchx.md``.

Example::

    torchx run -s torchstep_local utils.echo --msg hi
    torchx status torchstep_local://torchx/echo-1a2b3c
"""
