"""The plugin as aios sees it: registration, probe (torch builds, ROCm, CUDA_VISIBLE_DEVICES),
`aios devices` / `aios doctor` output from recorded hosts, and no torch import on those paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.plugins.registry import Registry
from aios_backend_cuda import probe


def _env(rec: Path | None = None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "CUDA_VISIBLE", "NCCL_", "FI_"))
    }
    if rec is not None:
        env["AIOS_TEST_NVML_RECORDING"] = str(rec)
    env.update(extra)
    return env


def _aios(*args: str, env: dict[str, str], no_torch: bool = True) -> subprocess.CompletedProcess:
    code = (
        "import sys; from aios.cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n"
        f"    assert {no_torch!r} is False or 'torch' not in sys.modules, 'imported torch'\n    raise\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_registered_with_priority_and_sections() -> None:
    reg = Registry(strict=True)
    assert "aios-backend-cuda" in reg.plugins
    spec = reg.backends["cuda"]
    assert (
        spec.priority == 100 and spec.device_type == "cuda" and spec.plugin == "aios-backend-cuda"
    )
    assert set(reg.config_sections) >= {"cuda", "deepspeed"}
    hooks = set(reg.plugins["aios-backend-cuda"].hooks)
    assert {
        "aios_register_backends",
        "aios_register_accelerators",
        "aios_register_strategies",
    } <= hooks
    # components are carried by the registered spec (discover, launch_plan, precision, doctor)
    assert "aios_doctor_checks" not in hooks
    assert (
        spec.accelerator == "cuda"
        and spec.discover
        and spec.launch_plan
        and spec.precision
        and spec.doctor
    )
    assert "cuda" in reg.accelerators and {"ddp", "deepspeed"} <= set(reg.strategies_for(spec))
    assert "deepspeed" in reg.strategies_for(reg.backends["cpu"])


def test_plugin_import_is_light() -> None:
    code = (
        "import sys, aios_backend_cuda.plugin as p; from aios.plugins.registry import Registry; r = "
        "Registry(); r.probe('cuda'); print('torch' in sys.modules, 'deepspeed' in sys.modules, "
        "'pynvml' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    torch_loaded, ds_loaded, _ = out.stdout.split()
    assert torch_loaded == "False" and ds_loaded == "False"


@pytest.mark.parametrize(
    ("version", "ok", "words"),
    [
        ("2.4.0+cu121", True, ""),
        ("2.4.0", True, ""),
        ("2.4.0+cpu", False, "CPU-only"),
        ("2.4.0+rocm6.1", False, "ROCm"),
    ],
)
def test_probe_reads_torch_build_without_importing_it(
    recorded_host, version: str, ok: bool, words: str
) -> None:
    recorded_host("p5.48xlarge-8xh100.json", torch_version=version)
    avail = probe.probe()
    assert bool(avail) is ok
    assert words in avail.reason


def test_probe_cuda_visible_devices_hides_all(
    recorded_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorded_host("pcie-2xt4.json", torch_version="2.4.0+cu121")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    avail = probe.probe()
    assert not avail and "hides all 2" in avail.reason


def test_torch_build_tags() -> None:
    assert probe.TorchBuild("2.4.0+cu121").cuda_tag == "12.1"
    assert probe.TorchBuild("2.6.0+cu126").cuda_tag == "12.6"
    assert (
        probe.TorchBuild("2.4.0").cuda_tag is None and probe.TorchBuild("2.4.0").flavour == "cuda"
    )
    assert probe.TorchBuild(None).flavour == "none"


def test_aios_devices_matrix_from_recording(recorded_host) -> None:
    rec = recorded_host("mixed-4090-1080ti.json", torch_version="2.4.0+cu121")
    out = _aios("devices", "--backend", "cuda", env=_env(rec))
    assert out.returncode == 0, out.stderr
    assert "cuda links" in out.stdout and "PHB" in out.stdout
    assert "mixed GPU models" in out.stdout
    js = _aios("devices", "--backend", "cuda", "--json", env=_env(rec))
    rep = json.loads(js.stdout)[0]
    assert rep["available"] is True and rep["count"] == 2
    assert [d["name"] for d in rep["devices"]] == [
        "NVIDIA GeForce RTX 4090",
        "NVIDIA GeForce GTX 1080 Ti",
    ]
    assert rep["topology"]["p2p_matrix"] == [
        ["", "GPU0", "GPU1"],
        ["GPU0", "X", "NS"],
        ["GPU1", "NS", "X"],
    ]


def _doctor(rec: Path, **extra: str) -> list[dict]:
    out = _aios("doctor", "--backend", "cuda", "--json", env=_env(rec, **extra), no_torch=False)
    return json.loads(out.stdout)


def test_doctor_p5_healthy(recorded_host) -> None:
    rec = recorded_host("p5.48xlarge-8xh100.json", torch_version="2.4.0+cu121")
    checks = {c["name"]: c for c in _doctor(rec)}
    assert (
        checks["NVIDIA driver"]["status"] == "pass"
        and "535.183.01" in checks["NVIDIA driver"]["message"]
    )
    assert checks["GPUs visible"]["message"].startswith("8: 8x NVIDIA H100 80GB HBM3")
    assert checks["driver vs torch CUDA"]["status"] == "pass"
    assert (
        checks["GPU peer-to-peer"]["status"] == "pass"
        and "NV18" in checks["GPU peer-to-peer"]["message"]
    )
    assert checks["bf16"]["status"] == "pass"


@pytest.mark.parametrize(
    ("torch_version", "status"),
    [("2.5.0+cu124", "warn"), ("2.9.0+cu130", "fail"), ("2.4.0+cu118", "pass")],
)
def test_doctor_driver_vs_torch_cuda(recorded_host, torch_version: str, status: str) -> None:
    rec = recorded_host("p5.48xlarge-8xh100.json", torch_version=torch_version)  # driver: CUDA 12.2
    check = next(c for c in _doctor(rec) if c["name"] == "driver vs torch CUDA")
    assert check["status"] == status
    if status != "pass":
        assert check["fix"]


def test_doctor_t4_pair_warns_p2p_and_bf16(recorded_host) -> None:
    rec = recorded_host("pcie-2xt4.json", torch_version="2.4.0+cu121")
    checks = {c["name"]: c for c in _doctor(rec)}
    assert (
        checks["GPU peer-to-peer"]["status"] == "warn"
        and "0-1" in checks["GPU peer-to-peer"]["message"]
    )
    assert checks["bf16"]["status"] == "warn" and "Tesla T4" in checks["bf16"]["message"]


def test_doctor_cpu_only_torch_fails(recorded_host) -> None:
    rec = recorded_host("pcie-2xt4.json", torch_version="2.4.0+cpu")
    out = _aios("doctor", "--backend", "cuda", env=_env(rec), no_torch=False)
    assert out.returncode == 1
    assert "FAIL" in out.stdout and "CPU build" in out.stdout


def test_doctor_without_gpu_fails_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if Path("/proc/driver/nvidia/gpus").exists():
        pytest.skip("this machine has the NVIDIA driver")
    env = _env(AIOS_TEST_NVML_RECORDING="")
    env.pop("AIOS_TEST_NVML_RECORDING")
    asked = _aios("doctor", "--backend", "cuda", "--json", env=env, no_torch=False)
    checks = [c for c in json.loads(asked.stdout) if c.get("backend") == "cuda"]
    assert asked.returncode == 1 and checks[0]["status"] == "fail"
    everything = _aios("doctor", "--json", env=env, no_torch=False)
    cuda = [c for c in json.loads(everything.stdout) if c.get("backend") == "cuda"]
    assert cuda and all(c["status"] != "fail" for c in cuda)
