"""Precision on CUDA: bf16 refused (ConfigError naming the GPU and the fix) on GPUs below compute
capability 8.0, decided from NVML discovery (recorded hosts), through the plugin hook."""

from __future__ import annotations

import pytest
from aios.config.schema import resolve
from aios.errors import ConfigError
from aios.strategies.precision import GradScalerPrecision, MixedPrecision, TruePrecision
from aios.types import Lazy
from aios_backend_cuda.precision import backend_precision, check_bf16


def _cfg(**flags):
    return resolve(flags=flags, environ={}, check_backend=False)


def _make(precision, config):
    from aios_backend_cuda.accelerator import CudaAccelerator

    return backend_precision(precision, config, CudaAccelerator(config))


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_bf16_refused_on_t4(recorded_host, precision: str) -> None:
    recorded_host("pcie-2xt4.json")
    with pytest.raises(ConfigError) as err:
        _make(precision, _cfg(precision=precision))
    line = err.value.one_line()
    assert "cuda:0 Tesla T4 (compute capability 7.5)" in line and "cuda:1 Tesla T4" in line
    assert "precision=fp16-mixed" in line
    assert "\n" not in line


def test_bf16_on_mixed_host_names_the_old_gpu_and_the_way_out(
    recorded_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded_host("mixed-4090-1080ti.json")
    with pytest.raises(ConfigError) as err:
        check_bf16("bf16-mixed")
    msg = err.value.one_line()
    assert "GTX 1080 Ti" in msg and "6.1" in msg and "RTX 4090" not in msg.split(";")[0]
    assert "CUDA_VISIBLE_DEVICES=0" in msg
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # only the RTX 4090
    check_bf16("bf16-mixed")


def test_precisions_allowed_on_h100(recorded_host) -> None:
    recorded_host("p5.48xlarge-8xh100.json")
    cfg = _cfg()
    p = _make("bf16-mixed", cfg)
    assert isinstance(p, MixedPrecision) and p.device_type == "cuda" and p.dtype_name == "bfloat16"
    assert isinstance(_make("bf16-true", cfg), TruePrecision)


def test_fp16_allowed_on_t4_with_grad_scaler(recorded_host) -> None:
    pytest.importorskip("torch")
    recorded_host("pcie-2xt4.json")
    p = _make("fp16-mixed", _cfg())
    assert isinstance(p, GradScalerPrecision) and p.name == "fp16-mixed"


def test_the_policy_is_carried_by_the_cuda_backend_spec_only() -> None:
    from aios.plugins.registry import Registry

    reg = Registry(strict=True)
    assert reg.backends["cuda"].precision == Lazy(
        "aios_backend_cuda.precision:backend_precision", "aios-backend-cuda"
    )
    assert reg.backends["cpu"].precision is None and reg.backends["cpu"].plugin == "aios-core"
