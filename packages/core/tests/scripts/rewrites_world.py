"""A script that overwrites the launcher's WORLD_SIZE (and RANK) as if from MPI variables that
are absent under aios-run, then trains: with aios.init, or as a plain torchrun script."""

import os
import sys

os.environ["WORLD_SIZE"] = os.environ.get("OMPI_COMM_WORLD_SIZE", "1")
os.environ["RANK"] = os.environ.get("OMPI_COMM_WORLD_RANK", "0")


if sys.argv[1:] == ["aios"]:
    import aios

    rt = aios.init()
    print("TRAINED", rt.world_size, flush=True)
else:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    print("TRAINED", dist.get_world_size(), flush=True)
    dist.destroy_process_group()
