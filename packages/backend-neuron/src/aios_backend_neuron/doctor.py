"""``aios doctor --backend neuron``: packages from the right index, consistent versions, cores
visible, compiler present, removed or CUDA-only things flagged. Reads metadata, env and
``neuron-ls`` only: no torch import."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from aios.errors import AiosError
from aios.plugins import versions as V
from aios.types import DoctorCheck

from aios_backend_neuron.discovery import (
    device_nodes,
    find_neuron_ls,
    format_core_list,
    run_neuron_ls,
    visible_core_ids,
)
from aios_backend_neuron.launch import check_parallel
from aios_backend_neuron.packages import (
    INSTALL_LINE,
    compiler_path,
    detect,
    inspect,
    module_present,
    placeholder_message,
)
from aios_backend_neuron.settings import settings_of

if TYPE_CHECKING:
    from aios.config.settings import AiosConfig

B = "neuron"
# Installed packages whose kernels are CUDA-only: they import fine and then fail on Neuron.
CUDA_ONLY_DISTS = {
    "flash-attn": "FlashAttention",
    "bitsandbytes": "bitsandbytes",
    "apex": "NVIDIA apex",
    "xformers": "xformers",
    "triton": "Triton",
}


def _c(name: str, status: str, message: str, fix: str = "") -> DoctorCheck:
    return DoctorCheck(name, status, message, fix, backend=B)  # type: ignore[arg-type]


def _packages(sw: Any, explicit: bool) -> list[DoctorCheck]:
    """Packages from the right index."""
    out: list[DoctorCheck] = []
    if sw.placeholders:
        msg, fix = placeholder_message(sw)
        out.append(_c("Neuron packages from the Neuron index", "fail", msg, fix))
    tn = sw.torch_neuronx
    if tn.real:
        out.append(_c("torch-neuronx", "pass", f"torch-neuronx {tn.version}"))
    elif not tn.installed:
        out.append(_c("torch-neuronx", "fail", "torch-neuronx is not installed", INSTALL_LINE))
    rt = sw.runtime()
    if rt is not None:
        out.append(_c("runtime", "pass", sw.runtime_label()))
        if rt == "xla" and not sw.torch_xla.installed:
            out.append(
                _c(
                    "torch_xla",
                    "fail",
                    "torch-neuronx (XLA-based) needs torch_xla, which is not installed",
                    INSTALL_LINE,
                )
            )
    return out


def _versions(sw: Any, explicit: bool) -> list[DoctorCheck]:
    """Versions consistent."""
    out: list[DoctorCheck] = []
    rt, tn = sw.runtime(), sw.torch_neuronx
    problems = sw.version_problems()
    for p in problems:
        out.append(
            _c(
                "versions consistent",
                "fail",
                p,
                "install torch, torch-neuronx (and torch_xla) from one Neuron release: "
                + INSTALL_LINE,
            )
        )
    if rt is not None and not problems:
        vs = f"torch {sw.torch.version}" + (
            f", torch_xla {sw.torch_xla.version}" if rt == "xla" and sw.torch_xla.installed else ""
        )
        out.append(_c("versions consistent", "pass", f"{vs}, torch-neuronx {tn.version}"))
    if rt is not None and not sw.xla_cpu_stand_in:
        out.append(version_set_check(rt, sw))
    if rt == "xla":
        out.append(
            _c(
                "XLA runtime (Trn1)",
                "warn" if explicit else "pass",
                "the XLA-based torch-neuronx is kept for Trn1 only: Neuron 2.30 ended PyTorch/XLA training; "
                "Trn1 stays on it with Neuron <= 2.29 pinned (torch-neuronx 2.9.0.2.29.*, torch 2.9, "
                "DLAMI venv /opt/aws_neuronx_venv_pytorch_2_9)",
                "on Trn2/Trn3 use TorchNeuron (Neuron 2.33, /opt/aws_neuronx_venv_torch_neuronx_2_14_0)",
            )
        )
    return out


def _compiler(sw: Any, settings: Any) -> list[DoctorCheck]:
    """Compiler."""
    out: list[DoctorCheck] = []
    rt = sw.runtime()
    cc = sw.neuronx_cc
    if cc.real:
        exe = compiler_path()
        if exe or module_present("neuronxcc"):
            out.append(
                _c(
                    "neuronx-cc compiler",
                    "pass",
                    f"neuronx-cc {cc.version}" + (f" ({exe})" if exe else ""),
                )
            )
        else:
            out.append(
                _c(
                    "neuronx-cc compiler",
                    "fail",
                    f"neuronx-cc {cc.version} is installed but neither the neuronx-cc command "
                    "nor the neuronxcc module is found",
                    INSTALL_LINE,
                )
            )
    elif not cc.installed:
        out.append(
            _c(
                "neuronx-cc compiler",
                "fail",
                "neuronx-cc (the Neuron compiler) is not installed",
                INSTALL_LINE,
            )
        )

    nxd = sw.neuronx_distributed
    if nxd.real:
        out.append(
            _c(
                "neuronx-distributed",
                "warn" if rt == "native" else "pass",
                f"neuronx-distributed {nxd.version} (legacy: NxD Training/Core are in "
                "maintenance, last supported in Neuron 2.31)",
                "on TorchNeuron use strategy=fsdp / tp (FSDP2, DTensor) instead"
                if rt == "native"
                else "",
            )
        )
    elif not nxd.installed:
        need = settings.tp_degree > 1 or settings.pp_degree > 1 or settings.zero1
        out.append(
            _c(
                "neuronx-distributed",
                "fail" if need else "warn",
                "neuronx-distributed is not installed"
                + (
                    " but neuron.tp_degree/pp_degree/zero1 need it"
                    if need
                    else " (needed for tensor/pipeline parallelism)"
                ),
                INSTALL_LINE,
            )
        )
    return out


def _cores(config: AiosConfig | None, settings: Any) -> list[DoctorCheck]:
    """Cores visible."""
    out: list[DoctorCheck] = []
    ls = run_neuron_ls(settings.neuron_ls)
    if ls.topology is not None and ls.topology.devices:
        topo = ls.topology

        spec = settings.visible_cores or os.environ.get("NEURON_RT_VISIBLE_CORES")
        origin = "neuron.visible_cores" if settings.visible_cores else "NEURON_RT_VISIBLE_CORES"
        try:
            cores = visible_core_ids(topo, spec, origin)
            out.append(
                _c(
                    "NeuronCores visible",
                    "pass",
                    f"{len(cores)} logical cores ({format_core_list(cores)}) on "
                    f"{len(topo.devices)} devices, LNC={topo.lnc}"
                    + (f", {topo.instance_type}" if topo.instance_type else ""),
                )
            )
            if settings.tp_degree > 1 and cores:
                try:
                    check_parallel(
                        settings.tp_degree,
                        settings.pp_degree,
                        len(cores),
                        len(cores) * (config.nnodes if config is not None else 1),
                    )
                except AiosError as exc:
                    out.append(_c("parallel degrees", "fail", exc.message, exc.fix))
        except AiosError as exc:
            out.append(_c("NeuronCores visible", "fail", exc.message, exc.fix))
        busy = [d.index for d in topo.devices if d.processes]
        if busy:
            out.append(
                _c(
                    "NeuronCores free",
                    "warn",
                    f"devices {', '.join(map(str, busy))} are in use by other processes",
                    "stop them (see neuron-ls) or pick other cores with neuron.visible_cores",
                )
            )
    else:
        nodes = device_nodes()
        msg = ls.error or "neuron-ls lists no devices"
        out.append(
            _c(
                "NeuronCores visible",
                "fail",
                msg + (f"; {len(nodes)} /dev/neuron* nodes exist" if nodes else ""),
                "run on a Trainium instance with aws-neuronx-dkms and aws-neuronx-tools installed",
            )
        )
    return out


def _unsupported(config: AiosConfig | None, settings: Any) -> list[DoctorCheck]:
    """Removed / unsupported things."""
    out: list[DoctorCheck] = []
    for var in ("XLA_USE_BF16", "XLA_DOWNCAST_BF16"):
        if os.environ.get(var, "").strip() not in ("", "0"):
            out.append(
                _c(
                    "removed bf16 switches",
                    "fail",
                    f"{var} is set (removed from torch-neuronx)",
                    f"unset {var}; use precision=bf16-true or bf16-mixed",
                )
            )
    precision = config.precision if config is not None else None
    if precision == "fp16-mixed":
        out.append(
            _c(
                "precision",
                "fail",
                "precision fp16-mixed is not supported on Trainium",
                "use precision=bf16-mixed or bf16-true",
            )
        )

    cuda_only = [
        f"{label} ({d.version})"
        for name, label in CUDA_ONLY_DISTS.items()
        if (d := inspect(name)).installed
    ]
    if cuda_only:
        out.append(
            _c(
                "CUDA-only packages",
                "warn",
                f"installed but unsupported on NeuronCores: {', '.join(cuda_only)}",
                "make sure the training script does not import them on Neuron (aios-run --dry-run flags such imports)",
            )
        )
    else:
        out.append(
            _c(
                "CUDA-only packages",
                "pass",
                "none of flash-attn, bitsandbytes, apex, xformers, triton installed",
            )
        )
    cache = settings.compile_cache
    if not cache.startswith("s3://"):
        parent = cache
        while parent and not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if parent and not os.access(parent, os.W_OK):
            out.append(
                _c(
                    "compile cache",
                    "fail",
                    f"compile cache {cache} is not writable",
                    "set neuron.compile_cache to a writable directory or an s3:// URL",
                )
            )
        else:
            out.append(_c("compile cache", "pass", f"{cache} (NEURON_COMPILE_CACHE_URL)"))
    else:
        out.append(_c("compile cache", "pass", f"{cache} (shared on S3)"))
    return out


def checks(config: AiosConfig | None = None, explicit: bool = True) -> list[DoctorCheck]:
    """All checks. With ``explicit=False`` (plain ``aios doctor``) and nothing Neuron-related
    installed or attached, a single informational line is returned instead of failures."""
    settings = settings_of(config)
    sw = detect()
    out: list[DoctorCheck] = []
    if (
        not explicit
        and not any(d.installed for d in (sw.torch_neuronx, sw.neuronx_cc, sw.neuronx_distributed))
        and not device_nodes()
        and find_neuron_ls(settings.neuron_ls) is None
    ):
        return [_c("neuron", "pass", "not a Trainium machine and no Neuron packages (skipped)")]
    out += _packages(sw, explicit)
    out += _versions(sw, explicit)
    out += _compiler(sw, settings)
    out += _cores(config, settings)
    out += _unsupported(config, settings)
    return out


def version_set_check(runtime: str, sw: Any) -> DoctorCheck:
    """Installed torch / torch-neuronx (/ torch-xla) against :mod:`aios.plugins.versions`."""
    stack = "neuron" if runtime == "native" else "neuron-xla"
    found = {
        "torch-neuronx": sw.torch_neuronx.version,
        "torch": sw.torch.version,
        "torch-xla": sw.torch_xla.version,
    }
    res = V.check(stack, versions=found)
    if res.ok:
        return _c("version set", "pass", res.line())
    return _c("version set", "fail", res.line(), res.fix())
