"""A gloo all-reduce across every rank of the job: each rank adds rank + 1, so the sum is
world * (world + 1) / 2 everywhere. Prints where it ran (hostname, pod IP) for the test."""

import os
import socket

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    host = socket.gethostname()
    with open("/proc/1/cmdline", "rb") as f:
        pid1 = f.read().split(b"\0")[0].decode()
    ip = socket.gethostbyname(host)
    master = os.environ.get("MASTER_ADDR")
    print(
        f"allreduce rank={rank} world={world} sum={int(t.item())} host={host} ip={ip} pid1={pid1} master={master}",
        flush=True,
    )
    assert int(t.item()) == world * (world + 1) // 2
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
