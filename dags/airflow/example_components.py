"""TorchX components of the example pipeline (prepare → train → evaluate).

Each returns a ``torchx.specs.AppDef``. ``image`` is the directory holding the app scripts
when run locally (a directory image is the working directory of every process, as with
TorchX's local scheduler) and a container image with the scripts in its working
directory on Kubernetes.

Example::

    from example_components import train
    print(torchstep.explain(train(data="/data/data.json"), target="kubernetes"))
"""

import os
import tempfile

from torchx import specs

#: The app scripts of this example (the default "image" for local runs).
APPS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "apps")
#: Each step writes under its own app id (the ${app_id} macro is bound per run and try).
OUT = os.path.join(tempfile.gettempdir(), "torchstep-example", specs.macros.app_id)


def prepare(rows: int = 256, out_dir: str = OUT, image: str = APPS) -> specs.AppDef:
    """Make a synthetic regression dataset and publish its path as output ``data``.

    Args:
        rows: number of samples
        out_dir: where data.json goes
        image: directory of the app scripts (local) or container image (Kubernetes)
    """
    args = ["prepare.py", "--out_dir", out_dir, "--rows", str(rows)]
    return specs.AppDef("prepare", roles=[specs.Role("prepare", image=image, entrypoint="python", args=args)])


def train(
    data: str,
    lr: float = 0.1,
    epochs: int = 30,
    replicas: int = 2,
    nproc_per_node: int = 2,
    max_retries: int = 1,
    out_dir: str = OUT,
    image: str = APPS,
) -> specs.AppDef:
    """Data-parallel training: ``replicas`` agents x ``nproc_per_node`` processes (gloo, CPU).

    Args:
        data: path of data.json (output ``data`` of prepare)
        lr: learning rate
        epochs: full passes over the data
        replicas: nodes (one torchstep-agent each)
        nproc_per_node: worker processes per node
        max_retries: retries of the whole step by the orchestrator (APPLICATION policy)
        out_dir: where model.pt goes
        image: directory of the app scripts (local) or container image (Kubernetes)
    """
    args = ["train.py", "--data", data, "--out_dir", out_dir, "--lr", str(lr), "--epochs", str(epochs)]
    role = specs.Role(
        "trainer",
        image=image,
        entrypoint="python",
        args=args,
        num_replicas=replicas,
        resource=specs.Resource(cpu=1, gpu=0, memMB=1024),
        max_retries=max_retries,
        retry_policy=specs.RetryPolicy.APPLICATION,
        metadata={"torchstep": {"nproc_per_node": nproc_per_node, "retry_delay": 5, "retry_backoff": 2}},
    )
    return specs.AppDef("train", roles=[role])


def evaluate(data: str, model: str, max_mse: float = 0.05, image: str = APPS) -> specs.AppDef:
    """Score the model on the dataset; a model above ``max_mse`` fails without retry.

    Args:
        data: path of data.json
        model: path of model.pt (output ``model`` of train)
        max_mse: highest acceptable mean squared error
        image: directory of the app scripts (local) or container image (Kubernetes)
    """
    args = ["evaluate.py", "--data", data, "--model", model, "--max_mse", str(max_mse)]
    return specs.AppDef("evaluate", roles=[specs.Role("evaluate", image=image, entrypoint="python", args=args)])
