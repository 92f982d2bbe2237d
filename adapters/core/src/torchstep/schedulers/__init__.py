"""TorchX schedulers backed by torchstep: ``torchx run -s torchstep_local|airflow|prefect|kfp``.

The core holds what every such scheduler needs — the private record of what was submitted
(:mod:`~torchstep.schedulers.records`), the chassis: errors, option rules, base class, state
mapping and log rules (:mod:`~torchstep.schedulers.base`), the REST client of the Airflow
and Prefect schedulers (:mod:`~torchstep.schedulers.rest`), the re-registration of TorchX's own schedulers
(:mod:`~torchstep.schedulers.builtins`) — and the schedulers that need no orchestrator
installed where ``torchx run`` runs: ``torchstep_local`` (:mod:`~torchstep.schedulers.local`)
and the REST clients of a remote deployment, ``airflow`` and ``prefect``
(:mod:`~torchstep.schedulers.airflow`, :mod:`~torchstep.schedulers.prefect`). ``kfp``
compiles a pipeline with KFP's SDK: it lives in its adapter (``torchstep_kfp.torchx_scheduler``).
See ``docs/torchx.md``.

Example::

    torchx run -s torchstep_local utils.echo --msg hi
    torchx status torchstep_local://torchx/echo-1a2b3c
"""
