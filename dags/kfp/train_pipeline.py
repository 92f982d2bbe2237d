"""The example KFP v2 pipeline: prepare → train (a distributed torchstep step) → evaluate.

``train`` is the project's TorchX component ``components/train.py:trainer`` as a KFP
container component (its parameters are the component's KFP inputs); ``prepare`` and
``evaluate`` are plain KFP lightweight components that pass values to and read the step's
outputs (the result, the loss, a Metrics artifact and the Model the rank-0 process saved).

Compile (from the repository root)::

    kfp dsl compile --py dags/kfp/train_pipeline.py --output train_pipeline.yaml

Run it on this machine with kfp.local: ``python dags/kfp/run_local.py``.
"""

from kfp import dsl
from torchstep_kfp import component_from_fn

#: The image of every step: it holds torchstep, torchstep-kfp and this repository's
#: components/ in its working directory (kfp.local runs in the current directory instead).
IMAGE = "ghcr.io/torchstep/examples:latest"

# One container with 2 DDP processes (replicas=1): a plain KFP task. replicas > 1 makes it
# a launcher step that runs the nodes as Kubernetes Jobs.
train_op = component_from_fn(
    "components/train.py:trainer",
    defaults={"replicas": 1, "nproc_per_node": 2, "steps": 30, "image": IMAGE},
    outputs={"loss": float, "first_loss": float},
    metrics=True,
    model=True,
)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def prepare(base_lr: float, workers: int) -> float:
    """The learning rate for `workers` data-parallel workers (linear scaling, capped)."""
    if not 0 < base_lr < 1:
        raise ValueError(f"base_lr must be in (0, 1), got {base_lr}")
    return round(min(base_lr * workers, 0.5), 6)


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def evaluate(result: dict, metrics: dsl.Input[dsl.Metrics], model: dsl.Input[dsl.Model], max_ratio: float) -> str:
    """Fail unless the training loss dropped below max_ratio of its first value."""
    loss, first = metrics.metadata["loss"], metrics.metadata["first_loss"]
    if result["state"] != "SUCCEEDED" or loss > max_ratio * first:
        raise RuntimeError(f"training did not converge: {first} -> {loss} ({result['state']})")
    return f"{result['app_id']}: loss {first:.4f} -> {loss:.4f}, model {model.metadata.get('source', model.uri)}"


@dsl.pipeline(name="torchstep-train")
def train_pipeline(
    base_lr: float = 0.05, steps: int = 30, max_ratio: float = 0.5, model_dir: str = "/tmp/model"
) -> str:
    """prepare → train (2 DDP processes, gloo) → evaluate."""
    lr = prepare(base_lr=base_lr, workers=2)
    train = train_op(lr=lr.output, steps=steps, model_dir=model_dir)
    return evaluate(
        result=train.outputs["result"],
        metrics=train.outputs["metrics"],
        model=train.outputs["model"],
        max_ratio=max_ratio,
    ).output
