"""A plain torchrun script (no aios.init): init_process_group wraps the excepthook with its own
``[rankN]:`` prefix; rank 1 raises, rank 0 then fails in a barrier."""

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("boom on rank 1")
dist.barrier()
