"""Load the trained model and report its accuracy on the held-out data (``test.pt``).

Publishes ``accuracy`` and ``chance`` (1 / classes) with ``torchstep.output``; with
``--min-accuracy`` it fails (non-retryable: the same model fails again) below that bar.

Example::

    python components/apps/evaluate.py --data /tmp/data --model /tmp/ckpt/model.pt
"""

import argparse

import torch
import torchstep


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the dataset directory (test.pt)")
    p.add_argument("--model", required=True, help="model.pt written by train_elastic.py")
    p.add_argument("--min-accuracy", type=float, default=0.0)
    a = p.parse_args()
    saved = torch.load(a.model)
    model = torch.nn.Sequential(
        torch.nn.Linear(saved["dim"], 32), torch.nn.ReLU(), torch.nn.Linear(32, saved["classes"])
    )
    model.load_state_dict(saved["model"])
    test = torch.load(f"{a.data}/test.pt")
    with torch.no_grad():
        accuracy = (model(test["x"]).argmax(1) == test["y"]).float().mean().item()
    chance = 1.0 / saved["classes"]
    print(f"held-out accuracy {accuracy:.4f} (chance {chance:.2f}) on {len(test['y'])} examples", flush=True)
    torchstep.output("accuracy", round(accuracy, 5))
    torchstep.output("chance", chance)
    if accuracy < a.min_accuracy:
        raise torchstep.NonRetryableError(f"accuracy {accuracy:.4f} is below the bar {a.min_accuracy}")


if __name__ == "__main__":
    main()
