"""Agent startup benchmark worker: join a gloo group, one barrier, leave."""

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
print(f"hello from rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
