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


# -- the batch-training pipeline: prepare → train → evaluate ------------------------------


def prepare(
    out: str = "/tmp/torchstep-batch/data",
    samples: int = 4000,
    seed: int = 0,
    max_retries: int = 1,
    fail_once: bool = False,
    image: str = DEFAULT_IMAGE,
) -> specs.AppDef:
    """Write a deterministic synthetic classification dataset (train.pt, test.pt) to out.

    Args:
        out: output directory (a volume on Kubernetes)
        samples: examples in total (80% train, 20% held out)
        seed: the same seed writes the same data
        max_retries: retries of the step by the orchestrator (APPLICATION)
        fail_once: fault injection: the first try fails (retryable) before writing
        image: container image, or a directory (the working directory on the local target)
    """
    args = ["components/apps/data.py", "--out", out, "--samples", str(samples), "--seed", str(seed)]
    args += ["--fail-once"] if fail_once else []
    role = specs.Role(
        "prepare",
        image=image,
        entrypoint="python",
        args=args,
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"retry_delay": 1}},
    )
    return specs.AppDef("prepare", roles=[role])


def train(
    data: str = "/tmp/torchstep-batch/data",
    ckpt: str = "/tmp/torchstep-batch/ckpt",
    model_dir: str = "",
    nnodes: str = "1",
    nproc_per_node: int = 2,
    epochs: int = 4,
    lr: float = 0.05,
    max_restarts: int = 1,
    retry_policy: str = "REPLICA",
    kill_rank: int = -1,
    kill_at_epoch: int = -1,
    fail_once: bool = False,
    non_retryable: bool = False,
    image: str = DEFAULT_IMAGE,
) -> specs.AppDef:
    """Elastic DDP training that checkpoints every epoch and resumes after a restart or retry.

    Args:
        data: dataset directory written by prepare
        ckpt: checkpoint directory, shared by every node (resume point of restarts and retries)
        model_dir: where rank 0 saves model.pt (default: the checkpoint directory)
        nnodes: nodes as "N" or "MIN:MAX" (elastic)
        nproc_per_node: worker processes per node
        epochs: epochs in total (a resumed run continues the count)
        lr: learning rate
        max_restarts: restarts of the worker group (REPLICA) or retries of the step (APPLICATION)
        retry_policy: REPLICA (the agent restarts) or APPLICATION (the orchestrator retries)
        kill_rank: fault injection: this global rank SIGKILLs itself (once) ...
        kill_at_epoch: ... in the middle of this epoch
        fail_once: fault injection: the first try exits 1 before training (retryable)
        non_retryable: fault injection: raise torchstep.NonRetryableError
        image: container image, or a directory (the working directory on the local target)
    """
    lo, _, hi = nnodes.partition(":")
    args = [
        "components/apps/train_elastic.py",
        "--data",
        data,
        "--ckpt",
        ckpt,
        "--epochs",
        str(epochs),
        "--lr",
        str(lr),
        "--kill-rank",
        str(kill_rank),
        "--kill-at-epoch",
        str(kill_at_epoch),
    ]
    args += ["--model-dir", model_dir] if model_dir else []
    args += ["--fail-once"] if fail_once else []
    args += ["--non-retryable"] if non_retryable else []
    role = specs.Role(
        name="train",
        image=image,
        entrypoint="python",
        args=args,
        num_replicas=int(hi or lo),
        min_replicas=int(lo),
        max_retries=max_restarts,
        retry_policy=specs.RetryPolicy[retry_policy],
        metadata={"torchstep": {"nproc_per_node": nproc_per_node}},
    )
    return specs.AppDef("train", roles=[role])


def evaluate(
    data: str = "/tmp/torchstep-batch/data",
    model: str = "/tmp/torchstep-batch/ckpt/model.pt",
    min_accuracy: float = 0.0,
    image: str = DEFAULT_IMAGE,
) -> specs.AppDef:
    """Accuracy of the trained model on the held-out data (fails below min_accuracy).

    Args:
        data: dataset directory written by prepare
        model: model.pt written by train
        min_accuracy: the bar; below it the step fails without retry
        image: container image, or a directory (the working directory on the local target)
    """
    args = ["components/apps/evaluate.py", "--data", data, "--model", model, "--min-accuracy", str(min_accuracy)]
    return specs.AppDef("evaluate", roles=[specs.Role("evaluate", image=image, entrypoint="python", args=args)])
