"""Step semantics on the native TorchNeuron runtime (torch-neuronx for torch 2.10+).

TorchNeuron registers Trainium as the PrivateUse1 device ``neuron`` and a ``neuron``
process-group backend, so data parallelism is plain ``DistributedDataParallel``: core's
:class:`aios.strategies.ddp.DDPStrategy` over :class:`NeuronAccelerator`. ``import torch_neuronx``
must happen before the process group is created (it registers the backend): the accelerator's
``setup`` does it.
"""

from __future__ import annotations

from typing import Any

from aios.devices.accelerator import Accelerator
from aios.strategies.ddp import DDPStrategy


class NeuronAccelerator(Accelerator):
    name = "neuron"
    device_type = "neuron"
    dist_backend = "neuron"
    supports_fp16 = False
    compile_backend = "neuron"
    collectives_on_device = True  # the neuron process group reduces device tensors, like NCCL

    def setup(self) -> None:
        import torch_neuronx  # noqa: F401  (registers the neuron device and process-group backend)

    def device(self, local_rank: int) -> Any:
        import torch

        # each torchrun worker owns its NeuronCore(s); torch-neuronx maps LOCAL_RANK to them
        return torch.device("neuron")

    def set_device(self, device: Any) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        import torch

        if hasattr(torch, "neuron") and hasattr(torch.neuron, "manual_seed"):
            torch.neuron.manual_seed(seed)


class NeuronNativeStrategy(DDPStrategy):
    name = "neuron-native"

    def __init__(self, config: Any) -> None:
        super().__init__(config, NeuronAccelerator(config))
