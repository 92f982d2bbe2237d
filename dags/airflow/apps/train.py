"""Data-parallel linear regression with torch.distributed (gloo, CPU): every rank trains on
its shard, gradients are all-reduced by DDP, rank 0 saves the model and publishes it."""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torchstep
from torch.nn.parallel import DistributedDataParallel as DDP


@torchstep.record
def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out_dir", required=True)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--epochs", type=int, default=30)
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(a.data) as f:
        rows = json.load(f)["rows"][rank::world]  # this rank's shard
    x = torch.tensor([r["x"] for r in rows])
    y = torch.tensor([r["y"] for r in rows]).unsqueeze(1)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(x.shape[1], 1))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    for epoch in range(a.epochs):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        if epoch % 10 == 0 or epoch == a.epochs - 1:
            print(f"epoch {epoch} loss {loss.item():.5f} (rank {rank} of {world})", flush=True)
    total = loss.detach().clone()
    dist.all_reduce(total)
    if rank == 0:
        os.makedirs(a.out_dir, exist_ok=True)
        path = os.path.join(a.out_dir, "model.pt")
        torch.save(model.module.state_dict(), path)
        torchstep.output("model", path)
        torchstep.output("loss", total.item() / world)
        torchstep.output("world_size", world)
        torchstep.output("lr", a.lr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
