"""Step semantics on the XLA-based torch-neuronx: backend-xla's :class:`XlaStrategy`, subclassed.

torch-neuronx up to the torch 2.9 line *is* torch_xla with a Neuron PJRT plugin, so the step is
the same as on a TPU: no DDP wrapper, gradients all-reduced once per optimizer step, one graph
cut per step, prefetching device loader with fixed shapes, checkpoints moved to CPU on the
saving rank. What differs, and lives here:

* ``PJRT_DEVICE=NEURON`` (``CPU`` under the test stand-in), and the Neuron environment
  (compile cache, compiler flags, stochastic rounding, logical-core config) put in place before
  the runtime starts when the launcher did not set it (plain ``python train.py``);
* processes come from ``torchrun`` (one per NeuronCore), so backend-xla's process group
  (``init_process_group("xla", init_method="xla://")``) is created before the runtime starts
  (:attr:`XlaStrategy.group_before_runtime`), and the node rank is the cluster environment's
  (torchelastic's ``GROUP_RANK``);
* :class:`NeuronNxDStrategy`: tensor/pipeline parallelism and ZeRO-1 through neuronx-distributed.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from aios.errors import AiosError
from aios_backend_xla.strategy import XlaStrategy

from aios_backend_neuron import catalog
from aios_backend_neuron.launch import check_parallel, compiler_flags
from aios_backend_neuron.nxd import nxd_config_kwargs
from aios_backend_neuron.settings import settings_of

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from aios.strategies.precision import Precision


class NeuronXlaStrategy(XlaStrategy):
    """Data parallel over NeuronCores through torch-neuronx (torch_xla + Neuron PJRT)."""

    name = "neuron-xla"

    def __init__(self, config: Any, pjrt_device: str = "NEURON") -> None:
        super().__init__(config, pjrt_device=pjrt_device)
        self.neuron = settings_of(config)

    #: processes come from torchrun (one per NeuronCore): the xla group is created first
    group_before_runtime = True

    # ---------------------------------------------------------------- environment
    def neuron_env(self) -> dict[str, str]:
        """Neuron variables this process needs (the launch plan sets the same ones)."""

        s = self.neuron
        env: dict[str, str] = {"NEURON_COMPILE_CACHE_URL": s.compile_cache}
        flags = compiler_flags(s, catalog.family_defaults(s.instance_type))
        if flags:
            env["NEURON_CC_FLAGS"] = " ".join(flags)
        sr = s.stochastic_rounding
        if sr is None and self.config.precision == "bf16-true":
            sr = True
        if sr is not None:
            env["NEURON_RT_STOCHASTIC_ROUNDING_EN"] = "1" if sr else "0"
        if s.logical_nc_config:
            env["NEURON_LOGICAL_NC_CONFIG"] = str(s.logical_nc_config)
        if s.visible_cores:
            env["NEURON_RT_VISIBLE_CORES"] = s.visible_cores
        env.update(s.env)
        return env

    def prepare_env(self) -> None:
        super().prepare_env()  # PJRT_DEVICE (checked, explicit), removed XLA_USE_BF16 refused
        for k, v in self.neuron_env().items():
            os.environ.setdefault(k, v)  # the launcher's values win

    def metrics(self) -> dict[str, Any]:
        out = super().metrics()
        out["neuron"] = {
            "runtime": "xla",
            "compile_cache": os.environ.get("NEURON_COMPILE_CACHE_URL", ""),
            "cc_flags": os.environ.get("NEURON_CC_FLAGS", ""),
            "stochastic_rounding": os.environ.get("NEURON_RT_STOCHASTIC_ROUNDING_EN", ""),
        }
        return out


class NeuronNxDStrategy(NeuronXlaStrategy):
    """Tensor/pipeline parallel and ZeRO-1 through neuronx-distributed (NxD).

    ``neuronx_distributed_config`` is created at setup from ``neuron.tp_degree``,
    ``neuron.pp_degree``, ``neuron.zero1``, ``grad_clip`` and ``precision``
    (:func:`aios_backend_neuron.nxd.nxd_config_kwargs`); it initialises the model-parallel
    groups, so build the model (with NxD parallel layers for TP) after ``aios.init``. The model
    goes through ``initialize_parallel_model`` and the optimizer through
    ``initialize_parallel_optimizer``, whose ``step`` reduces gradients over the data-parallel
    group and clips them; data are sharded by data-parallel rank, not global rank.
    """

    name = "neuron-nxd"

    def setup_environment(self) -> None:
        super().setup_environment()

        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)) or self.world_size)
        check_parallel(self.neuron.tp_degree, self.neuron.pp_degree, local, self.world_size)
        import neuronx_distributed as nxd
        from neuronx_distributed.parallel_layers import parallel_state

        self._ps = parallel_state
        self.nxd_config = nxd.neuronx_distributed_config(
            **nxd_config_kwargs(self.neuron, self.config)
        )

    @property
    def data_rank(self) -> int:
        return int(self._ps.get_data_parallel_rank())

    @property
    def data_world(self) -> int:
        return int(self._ps.get_data_parallel_size())

    def setup_module(self, module: torch.nn.Module, precision: Precision) -> torch.nn.Module:
        import neuronx_distributed as nxd

        inner = precision.convert_module(self.unwrap(module))
        return nxd.initialize_parallel_model(self.nxd_config, lambda: inner)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        import neuronx_distributed as nxd

        optimizer = super().setup_optimizer(optimizer)  # fused=True switched off
        groups = [dict(g) for g in optimizer.param_groups]
        return nxd.initialize_parallel_optimizer(
            self.nxd_config, type(optimizer), groups, **optimizer.defaults
        )

    def reduce_once(self, optimizer: torch.optim.Optimizer) -> None:
        return  # NxD's optimizer reduces over the data-parallel group inside step()

    def clip_grad_norm(self, module: Any, optimizer: Any, max_norm: float, precision: Any) -> Any:
        # clipping happens in the NxD optimizer's step (optimizer_config.grad_clipping/max_grad_norm)
        return getattr(optimizer, "grad_norm", None)

    def module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        if self.neuron.tp_degree > 1 or self.neuron.pp_degree > 1:
            raise AiosError(
                "aios checkpoints of tensor/pipeline-parallel NxD models are not supported "
                "yet (each rank holds a shard)",
                "save with neuronx_distributed.trainer.save_checkpoint(dir, tag, model=..., optimizer=...)",
            )
        return super().module_state_dict(module)
