"""TorchX components of the project's main job (``components/apps/train.py``).

Run it on this machine with ``torchstep run components/train.py:trainer -- --replicas 2``,
or from Python::

    import torchstep
    app = torchstep.materialize("components/train.py:trainer", ["--replicas", "2"])
    result = torchstep.run_local(app)
"""

from typing import Dict, Optional  # noqa: UP035 - TorchX's file_linter reads typing annotations

import torchx.specs as specs

#: Where the code lives when the job runs in a container (the local target ignores an image
#: that is not a directory and runs in the current directory).
DEFAULT_IMAGE = "ghcr.io/torchstep/examples:latest"


def trainer(
    replicas: int = 2,
    nproc_per_node: int = 2,
    steps: int = 50,
    lr: float = 0.1,
    step_time: float = 0.0,
    max_retries: int = 0,
    retry_policy: str = "APPLICATION",
    cpu: int = 1,
    memMB: int = 1024,
    image: str = DEFAULT_IMAGE,
    script: str = "components/apps/train.py",
    env: Optional[Dict[str, str]] = None,  # noqa: UP006, UP045
    model_dir: Optional[str] = None,  # noqa: UP045
) -> specs.AppDef:
    """Data-parallel training of a small regression model on synthetic data (CPU, gloo).

    Args:
        replicas: nodes (one torchstep-agent each)
        nproc_per_node: worker processes per node
        steps: optimizer steps
        lr: learning rate
        step_time: extra seconds per step, to make the job last longer
        max_retries: retries, owned by the layer retry_policy names
        retry_policy: APPLICATION (the orchestrator retries the step) or REPLICA (the agent restarts workers)
        cpu: CPU cores per node
        memMB: memory per node in MiB
        image: container image, or a directory (the working directory on the local target)
        script: the training script, relative to the image's working directory
        env: extra environment variables
        model_dir: where rank 0 saves the trained model (published as output ``model``)
    """
    return specs.AppDef(
        name="train",
        roles=[
            specs.Role(
                name="trainer",
                image=image,
                entrypoint="python",
                args=[
                    script,
                    "--steps",
                    str(steps),
                    "--lr",
                    str(lr),
                    "--step-time",
                    str(step_time),
                    "--run-id",
                    specs.macros.app_id,
                    *(["--model-dir", model_dir] if model_dir else []),
                ],
                env=env or {},
                num_replicas=replicas,
                resource=specs.Resource(cpu=cpu, gpu=0, memMB=memMB),
                max_retries=max_retries,
                retry_policy=specs.RetryPolicy[retry_policy],
                metadata={"torchstep": {"nproc_per_node": nproc_per_node}},
            )
        ],
    )
