"""A training script in torch_xla's habits (xmp.spawn, MpDeviceLoader, mark_step)."""

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
from torch.utils.data import DataLoader, TensorDataset

device = xm.xla_device()  # at import time: the parent process starts the runtime


def _mp_fn(index):
    dev = xm.xla_device()
    model = torch.nn.Linear(16, 1).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    data = TensorDataset(torch.randn(64, 16), torch.randn(64, 1))
    loader = pl.MpDeviceLoader(DataLoader(data, batch_size=8), dev)
    gen = torch.Generator(device=dev)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        xm.optimizer_step(opt)
        xm.mark_step()
    if xm.is_master_ordinal():
        xm.save(model.state_dict(), "model.pt")
    xm.master_print(f"done on {xm.xrt_world_size()} devices", gen)
    torch_xla.sync()


if __name__ == "__main__":
    xmp.spawn(_mp_fn, args=())
