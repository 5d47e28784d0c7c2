"""Rank 1 finishes making its process group 2 s after the others (a slow host); rank 0 writes
whether rank 1's group was made when its own ``aios.init()`` returned (argv[1]: a folder)."""

from __future__ import annotations

import os
import sys
import time

import torch.distributed.distributed_c10d as c10d

out = sys.argv[1]
make_group = c10d._new_process_group_helper


def slow_on_rank_1(*args, **kwargs):  # type: ignore[no-untyped-def]
    group = make_group(*args, **kwargs)
    if os.environ["RANK"] == "1":
        time.sleep(2.0)
        open(os.path.join(out, "rank1-group-made"), "w").close()
    return group


c10d._new_process_group_helper = slow_on_rank_1

import aios  # noqa: E402

rt = aios.init()
if rt.rank == 0:
    made = os.path.exists(os.path.join(out, "rank1-group-made"))
    with open(os.path.join(out, "rank0-saw"), "w") as f:
        f.write("made" if made else "not made")
