"""Airflow provider metadata of torchstep-airflow (entry point ``apache_airflow_provider``).

Import-free on purpose: Airflow calls this in every process that discovers providers
(scheduler, dag-processor, workers, ``airflow providers list``). No ``versions`` key:
Airflow takes the provider's version from the distribution's metadata (written once, in
pyproject.toml).

Example::

    >>> get_provider_info()["package-name"]
    'torchstep-airflow'
"""


def get_provider_info() -> dict:
    """The provider description Airflow's ProvidersManager reads."""
    return {
        "package-name": "torchstep-airflow",
        "name": "torchstep",
        "description": "Run TorchX AppDefs as Airflow tasks under torchstep's embedded elastic agent "
        "(locally in the worker or on Kubernetes).",
        "operators": [
            {
                "integration-name": "torchstep",
                "python-modules": ["torchstep_airflow.operators"],
            }
        ],
        "integrations": [
            {
                "integration-name": "torchstep",
                "external-doc-url": "https://github.com/pytorch/torchx",
                "tags": ["software"],
            }
        ],
        "task-decorators": [
            {"name": "torchstep", "class-name": "torchstep_airflow.decorators.torchstep_task"},
        ],
    }
