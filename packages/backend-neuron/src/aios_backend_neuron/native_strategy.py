"""Step semantics on the native TorchNeuron runtime (torch-neuronx for torch 2.10+).

TorchNeuron registers Trainium as the PrivateUse1 device ``neuron`` and a ``neuron``
process-group backend, so data parallelism is plain ``DistributedDataParallel``: this is core's
:class:`aios.strategies.ddp.DDPStrategy` with that device and backend. ``import torch_neuronx``
must happen before the process group is created (it registers the backend).
"""

from __future__ import annotations

from typing import Any

from aios.strategies.ddp import DDPStrategy


class NeuronNativeStrategy(DDPStrategy):
    name = "neuron-native"

    def __init__(self, config: Any) -> None:
        super().__init__(config, device_type="neuron", dist_backend="neuron")
        self.autocast_device_type = "neuron"

    def _register(self) -> None:
        import torch_neuronx  # noqa: F401  (registers the neuron device and process-group backend)

    def select_device(self) -> Any:
        import torch

        self._register()
        # each torchrun worker owns its NeuronCore(s); torch-neuronx maps LOCAL_RANK to them
        return torch.device("neuron")

    def init_process_group(self) -> None:
        self._register()
        super().init_process_group()

    def setup_environment(self) -> None:
        super().setup_environment()
        # the neuron process group reduces device tensors (like NCCL), not CPU ones
        self.collective_device = self.device

    def seed(self, seed: int) -> None:
        import torch

        if hasattr(torch, "neuron") and hasattr(torch.neuron, "manual_seed"):  # type: ignore[attr-defined]
            torch.neuron.manual_seed(seed)  # type: ignore[attr-defined]
