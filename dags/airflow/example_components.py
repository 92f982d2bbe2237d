"""TorchX components of the example pipeline's first and last steps (prepare, evaluate);
the training step is the project's ``components/train.py:trainer``.

Each returns a ``torchx.specs.AppDef``. ``image`` is the directory holding the app scripts
when run locally (a directory image is the working directory of every process, as with
TorchX's local scheduler) and a container image with the scripts in its working directory
on Kubernetes. Components are loaded by TorchX, which reads their annotations: keep them
real types (no ``from __future__ import annotations`` here).

Example::

    import torchstep, example_components
    print(torchstep.explain(example_components.prepare(base_lr=0.05), target="kubernetes"))
"""

import os

from torchx import specs

#: The app scripts of this example (the default "image" for local runs).
APPS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "apps")


def prepare(base_lr: float = 0.05, workers: int = 4, steps: int = 40, image: str = APPS) -> specs.AppDef:
    """Check the hyperparameters and scale the learning rate to the number of workers.

    Args:
        base_lr: learning rate of one worker
        workers: data-parallel workers of the training step (replicas x processes)
        steps: optimizer steps
        image: directory of the app scripts (local) or container image (Kubernetes)
    """
    args = ["prepare.py", "--base_lr", str(base_lr), "--workers", str(workers), "--steps", str(steps)]
    return specs.AppDef("prepare", roles=[specs.Role("prepare", image=image, entrypoint="python", args=args)])


def evaluate(loss: float, first_loss: float, max_ratio: float = 0.5, image: str = APPS) -> specs.AppDef:
    """Fail (without retry) when the training loss did not drop below max_ratio of its start.

    Args:
        loss: final loss (output ``loss`` of the training step)
        first_loss: loss of the first step (output ``first_loss``)
        max_ratio: highest acceptable loss / first_loss
        image: directory of the app scripts (local) or container image (Kubernetes)
    """
    args = ["evaluate.py", "--loss", str(loss), "--first_loss", str(first_loss), "--max_ratio", str(max_ratio)]
    return specs.AppDef("evaluate", roles=[specs.Role("evaluate", image=image, entrypoint="python", args=args)])
