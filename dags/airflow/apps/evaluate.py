"""Evaluate the trained model on the whole dataset; fail (non-retryably) when it is useless."""

import argparse
import json

import torch
import torchstep


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--max_mse", type=float, default=1.0)
    a = p.parse_args()
    with open(a.data) as f:
        rows = json.load(f)["rows"]
    x = torch.tensor([r["x"] for r in rows])
    y = torch.tensor([r["y"] for r in rows]).unsqueeze(1)
    model = torch.nn.Linear(x.shape[1], 1)
    model.load_state_dict(torch.load(a.model))
    with torch.no_grad():
        mse = torch.nn.functional.mse_loss(model(x), y).item()
    print(f"mse {mse:.5f} on {len(rows)} rows", flush=True)
    torchstep.output("mse", mse)
    if mse > a.max_mse:
        raise torchstep.NonRetryableError(f"model is worse than the threshold: mse {mse:.4f} > {a.max_mse}")


if __name__ == "__main__":
    main()
