"""The NeuronX Distributed configuration aios derives from its own config: a pure function, read
by the strategy choice (:mod:`aios_backend_neuron.strategy`) and by the NxD strategy
(:mod:`aios_backend_neuron.xla_strategy`) without either importing the other."""

from __future__ import annotations

from typing import Any

from aios_backend_neuron.settings import NeuronSettings


def nxd_config_kwargs(settings: NeuronSettings, config: Any) -> dict[str, Any]:
    """Keyword arguments for ``neuronx_distributed.neuronx_distributed_config`` from the aios
    config (``neuron.tp_degree``, ``neuron.pp_degree``, ``neuron.zero1``, ``grad_clip``,
    ``precision``)."""
    bf16_weights = getattr(config, "precision", "fp32") == "bf16-true"
    grad_clip = getattr(config, "grad_clip", None)
    kwargs: dict[str, Any] = {
        "tensor_parallel_size": settings.tp_degree,
        "pipeline_parallel_size": settings.pp_degree,
        "optimizer_config": {
            "zero_one_enabled": settings.zero1,
            "grad_clipping": grad_clip is not None,
            "max_grad_norm": float(grad_clip) if grad_clip is not None else 1.0,
        },
        # bf16 weights: with ZeRO-1, NxD keeps fp32 master weights and fp32 gradient accumulation
        # in the optimizer shards (the NxD equivalent of bf16 + stochastic rounding).
        "mixed_precision_config": {
            "use_master_weights": bf16_weights and settings.zero1,
            "use_fp32_grad_acc": bf16_weights and settings.zero1,
            "use_master_weights_in_ckpt": False,
        },
    }
    if settings.pp_degree > 1:
        kwargs["pipeline_config"] = {"num_microbatches": settings.pp_microbatches}
    return kwargs
