"""Run under aios-run --nprocs 2: rank 1 raises; rank 0 then fails in a barrier."""

import aios

rt = aios.init()
if rt.rank == 1:
    raise ValueError("boom on rank 1")
rt.barrier()
