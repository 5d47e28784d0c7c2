"""Choosing the step semantics for Trainium (imported only by the ``ddp``/``nxd`` strategy
factories and the precision policy, i.e. at ``aios.init`` in a worker; still no torch import).

* XLA-based torch-neuronx (``runtime=xla``): backend-xla's ``XlaStrategy`` with
  ``PJRT_DEVICE=NEURON`` (:class:`aios_backend_neuron.xla_strategy.NeuronXlaStrategy`), and with
  neuronx-distributed for tensor/pipeline parallelism or ZeRO-1
  (:class:`~aios_backend_neuron.xla_strategy.NeuronNxDStrategy`).
* Native TorchNeuron (``runtime=native``): core's ``DDPStrategy`` on device ``neuron`` with the
  ``neuron`` process-group backend (:class:`aios_backend_neuron.native_strategy.NeuronNativeStrategy`).
"""

from __future__ import annotations

from typing import Any

from aios.errors import BackendUnavailable, ConfigError
from aios_backend_neuron.packages import INSTALL_LINE, NeuronSoftware, detect, placeholder_message
from aios_backend_neuron.settings import NeuronSettings, settings_of


def active_runtime(config: Any, sw: NeuronSoftware | None = None) -> str | None:
    """``xla`` / ``native`` as configured, else as installed (``None``: nothing usable)."""
    settings = settings_of(config)
    sw = sw or detect()
    if settings.runtime != "auto":
        return settings.runtime
    return sw.runtime()


def uses_nxd(settings: NeuronSettings, config: Any) -> bool:
    return settings.tp_degree > 1 or settings.pp_degree > 1 or settings.zero1 or getattr(config, "strategy", "") == "nxd"


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


def make_strategy(config: Any) -> Any:
    settings = settings_of(config)
    sw = detect()
    if sw.placeholders:
        msg, fix = placeholder_message(sw)
        raise BackendUnavailable(msg, fix)
    runtime = active_runtime(config, sw)
    if runtime is None:
        raise BackendUnavailable("torch-neuronx is not installed (the AWS Neuron pip index has it, PyPI does not)", INSTALL_LINE)
    if runtime == "native":
        if uses_nxd(settings, config):
            raise ConfigError(
                "neuron.tp_degree/pp_degree/zero1 use neuronx-distributed, which runs on the XLA-based torch-neuronx",
                "set neuron.runtime=xla with torch-neuronx <= 2.9, or use DTensor/FSDP2 in the script on the native runtime",
            )
        from aios_backend_neuron.native_strategy import NeuronNativeStrategy

        return NeuronNativeStrategy(config)
    pjrt = "CPU" if sw.xla_cpu_stand_in else "NEURON"
    if uses_nxd(settings, config):
        if not sw.neuronx_distributed.real and not sw.xla_cpu_stand_in:
            raise BackendUnavailable(
                "neuron.tp_degree/pp_degree/zero1 need neuronx-distributed, which is not installed", INSTALL_LINE
            )
        from aios_backend_neuron.xla_strategy import NeuronNxDStrategy

        return NeuronNxDStrategy(config, pjrt_device=pjrt)
    from aios_backend_neuron.xla_strategy import NeuronXlaStrategy

    return NeuronXlaStrategy(config, pjrt_device=pjrt)
