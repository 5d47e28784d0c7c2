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
from aios.plugins import versions as V
from aios.strategies.fsdp import FSDPStrategy, HSDPStrategy, TPStrategy

from aios_backend_neuron.native_strategy import NeuronAccelerator, NeuronNativeStrategy
from aios_backend_neuron.nxd import nxd_config_kwargs
from aios_backend_neuron.packages import INSTALL_LINE, NeuronSoftware, detect, placeholder_message
from aios_backend_neuron.settings import NeuronSettings, settings_of
from aios_backend_neuron.xla_strategy import NeuronNxDStrategy, NeuronXlaStrategy

__all__ = [
    "active_runtime",
    "check_versions",
    "make_native_strategy",
    "make_strategy",
    "nxd_config_kwargs",  # defined in aios_backend_neuron.nxd; kept importable here
    "uses_nxd",
]


def active_runtime(config: Any, sw: NeuronSoftware | None = None) -> str | None:
    """``xla`` / ``native`` as configured, else as installed (``None``: nothing usable)."""
    settings = settings_of(config)
    sw = sw or detect()
    if settings.runtime != "auto":
        return settings.runtime
    return sw.runtime()


def uses_nxd(settings: NeuronSettings, config: Any) -> bool:
    return (
        settings.tp_degree > 1
        or settings.pp_degree > 1
        or settings.zero1
        or getattr(config, "strategy", "") == "nxd"
    )


def check_versions(runtime: str, sw: NeuronSoftware, host: str | None = None) -> None:
    """The installed set against :mod:`aios.plugins.versions` (``neuron`` for TorchNeuron, ``neuron-xla``
    for the XLA runtime), on every worker before training: one line naming the host, what is
    installed and what is expected. Skipped for the XLA:CPU test stand-in."""
    if sw.xla_cpu_stand_in:
        return

    found = {
        "torch-neuronx": sw.torch_neuronx.version,
        "torch": sw.torch.version,
        "torch-xla": sw.torch_xla.version,
    }
    V.require("neuron" if runtime == "native" else "neuron-xla", host=host, versions=found)


def _checked_runtime(config: Any) -> tuple[str, NeuronSoftware]:
    sw = detect()
    if sw.placeholders:
        msg, fix = placeholder_message(sw)
        raise BackendUnavailable(msg, fix)
    runtime = active_runtime(config, sw)
    if runtime is None:
        raise BackendUnavailable(
            "torch-neuronx is not installed (the AWS Neuron pip index has it, PyPI does not)",
            INSTALL_LINE,
        )
    return runtime, sw


def make_native_strategy(config: Any, name: str) -> Any:
    """Core's native ``fsdp`` / ``tp`` / ``hsdp`` over the neuron accelerator (TorchNeuron only)."""
    runtime, _ = _checked_runtime(config)
    if runtime != "native":
        raise ConfigError(
            f"strategy '{name}' needs TorchNeuron (the native neuron runtime, Trn2/Trn3); this is the XLA runtime",
            "use strategy=ddp or the legacy strategy=nxd on the XLA runtime (Trn1), or "
            "install TorchNeuron on Trn2/Trn3",
        )
    check_versions(runtime, _)

    cls = {"fsdp": FSDPStrategy, "tp": TPStrategy, "hsdp": HSDPStrategy}[name]
    return cls(config, NeuronAccelerator(config))


def make_strategy(config: Any) -> Any:
    settings = settings_of(config)
    runtime, sw = _checked_runtime(config)
    if runtime == "native":
        if uses_nxd(settings, config):
            raise ConfigError(
                "neuron.tp_degree/pp_degree/zero1 use neuronx-distributed, which runs on the XLA-based torch-neuronx",
                "set neuron.runtime=xla with torch-neuronx <= 2.9, or use DTensor/FSDP2 in "
                "the script on the native runtime",
            )
        check_versions(runtime, sw)

        return NeuronNativeStrategy(config)
    pjrt = "CPU" if sw.xla_cpu_stand_in else "NEURON"
    if uses_nxd(settings, config):
        if not sw.neuronx_distributed.real and not sw.xla_cpu_stand_in:
            raise BackendUnavailable(
                "neuron.tp_degree/pp_degree/zero1 need neuronx-distributed, which is not installed",
                INSTALL_LINE,
            )
        check_versions(runtime, sw)

        return NeuronNxDStrategy(config, pjrt_device=pjrt)
    check_versions(runtime, sw)

    return NeuronXlaStrategy(config, pjrt_device=pjrt)
