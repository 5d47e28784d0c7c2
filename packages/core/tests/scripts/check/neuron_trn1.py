"""A training script in torch-neuronx's habits on Trn1 (XLA runtime, NxD tensor parallel)."""

import os

import torch
import torch_neuronx  # noqa: F401
import torch_xla.core.xla_model as xm
import torch_xla.distributed.xla_backend  # noqa: F401
from neuronx_distributed.parallel_layers import parallel_state

os.environ["XLA_USE_BF16"] = "1"
os.environ["NEURON_CC_FLAGS"] = "--model-type transformer"


def main():
    torch.distributed.init_process_group("xla")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    device = xm.xla_device()
    model = torch.nn.Linear(16, 1).to(device).half()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(10):
        loss = model(torch.randn(8, 16, device=device)).sum()
        loss.backward()
        xm.optimizer_step(opt)
    if xm.get_ordinal() == 0:
        xm.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
