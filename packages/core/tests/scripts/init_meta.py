"""Run under aios-run --nprocs 2 strategy=fsdp: a model built on the meta device (too large
for one rank) is sharded as it is and initialised afterwards (``to_empty`` + init)."""

import aios
import torch

rt = aios.init()
with torch.device("meta"):
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
model = rt.setup(model)
model.to_empty(device=rt.device)
for m in model.modules():
    if isinstance(m, torch.nn.Linear):
        m.reset_parameters()
shard = next(iter(model.parameters()))
print(
    f"ok meta={shard.is_meta} local={tuple(shard.to_local().shape)} out={tuple(model(torch.ones(2, 8)).shape)}"
)
rt.close()
