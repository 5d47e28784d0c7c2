"""``aios doctor`` checks for the xla backend. No torch import in this process: torch_xla facts
come from package metadata and, with ``deep=True`` (``aios doctor --backend xla``), from a short
subprocess that imports torch_xla and reports whether the import alone initialised the runtime."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from aios.plugins import versions as V
from aios.types import DoctorCheck

from aios_backend_xla.discovery import discover, on_gce
from aios_backend_xla.precision import DEPRECATED_ENV
from aios_backend_xla.settings import ALLOW_CPU_ENV, cpu_opt_in, settings_of
from aios_backend_xla.tpu import (
    AUTOLOAD_ENV,
    INSTALL,
    SKIP_MDS_ENV,
    runtime_setting,
    torch_tpu_installed,
)

B = "xla"


def _ver(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _major_minor(v: str) -> tuple[str, ...]:
    return tuple(v.split("+")[0].split(".")[:2])


_PROBE = r"""
import json, os, sys
os.environ.setdefault("PJRT_DEVICE", "CPU")
import torch, torch_xla
print(json.dumps({"torch": torch.__version__, "torch_xla": torch_xla.__version__,
  "initialized": bool(torch_xla._XLAC._xla_runtime_is_initialized()),
  "libtpu": bool(getattr(torch_xla, "_found_libtpu", False))}))
"""


def _import_probe(timeout: float = 120.0) -> dict[str, Any] | str:
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # probe torch_xla alone, without TorchTPU's autoload
    try:
        out = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return f"importing torch_xla took more than {timeout:.0f} s"
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"importing torch_xla failed: {tail}"
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return "importing torch_xla printed nothing usable"


def _install(tv: str | None, xv: str | None) -> list[DoctorCheck]:
    """torch_xla installed, and of torch's release."""
    out: list[DoctorCheck] = []
    if xv is None or importlib.util.find_spec("torch_xla") is None:
        out.append(
            DoctorCheck(
                "torch_xla installed",
                "fail",
                "torch_xla is not installed",
                "pip install -e './packages/core[xla]' ./packages/backend-xla (from the aios "
                "checkout) (torch and torch_xla of the same release)",
                backend=B,
            )
        )
        return out
    out.append(DoctorCheck("torch_xla installed", "pass", f"torch_xla {xv}", backend=B))
    if tv is None:
        out.append(
            DoctorCheck(
                "torch/torch_xla versions",
                "fail",
                "torch is not installed",
                f"pip install torch=={xv}",
                backend=B,
            )
        )
    elif _major_minor(tv) != _major_minor(xv):
        out.append(
            DoctorCheck(
                "torch/torch_xla versions",
                "fail",
                f"torch {tv} does not match torch_xla {xv}",
                f"install matching releases: pip install torch=={'.'.join(_major_minor(xv))}.* torch_xla=={xv}",
                backend=B,
            )
        )
    else:
        out.append(
            DoctorCheck(
                "torch/torch_xla versions", "pass", f"torch {tv} matches torch_xla {xv}", backend=B
            )
        )
    out.append(version_set_check("torch_xla", B))
    return out


def _tpu_present(facts: Any, env: dict[str, str], xv: str) -> list[DoctorCheck]:
    """On a TPU VM: PJRT_DEVICE, libtpu, a free TPU, its device files, its metadata."""
    out: list[DoctorCheck] = []
    pjrt = env.get("PJRT_DEVICE", "")
    acc = facts.accelerator_type or "type unknown"
    out.append(
        DoctorCheck(
            "TPU attached",
            "pass",
            f"{acc}; {facts.pci_chips} chips on the PCI bus; sources: {', '.join(facts.sources)}",
            backend=B,
        )
    )
    if pjrt and pjrt.upper() != "TPU":
        out.append(
            DoctorCheck(
                "PJRT_DEVICE",
                "fail",
                f"PJRT_DEVICE={pjrt} on a TPU VM: training would not use the TPU",
                "unset PJRT_DEVICE (aios-run sets PJRT_DEVICE=TPU) or export PJRT_DEVICE=TPU",
                backend=B,
            )
        )
    elif not pjrt:
        out.append(
            DoctorCheck(
                "PJRT_DEVICE",
                "warn",
                "PJRT_DEVICE is unset: aios-run sets it, but `python train.py` alone may run on CPU",
                "export PJRT_DEVICE=TPU when running scripts without aios-run",
                backend=B,
            )
        )
    else:
        out.append(DoctorCheck("PJRT_DEVICE", "pass", "PJRT_DEVICE=TPU", backend=B))
    libtpu = importlib.util.find_spec("libtpu") is not None or bool(env.get("TPU_LIBRARY_PATH"))
    if libtpu:
        out.append(
            DoctorCheck(
                "libtpu",
                "pass",
                f"libtpu {_ver('libtpu') or env.get('TPU_LIBRARY_PATH', '')}".strip(),
                backend=B,
            )
        )
    else:
        out.append(
            DoctorCheck(
                "libtpu",
                "fail",
                "libtpu is not installed: torch_xla cannot drive the TPU",
                f"pip install 'torch_xla[tpu]=={xv}' -f https://storage.googleapis.com/libtpu-releases/index.html",
                backend=B,
            )
        )
    lock = "/tmp/libtpu_lockfile"
    if os.path.exists(lock):
        out.append(
            DoctorCheck(
                "TPU free",
                "warn",
                f"{lock} exists: another process may hold the TPU",
                "stop other TPU processes (sudo lsof -w /dev/accel* /dev/vfio/*); if none "
                "runs, delete the lock file",
                backend=B,
            )
        )
    accel = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    if not accel:
        out.append(
            DoctorCheck(
                "TPU device files",
                "warn",
                "no /dev/accel* or /dev/vfio/* device files",
                "the TPU runtime may be unhealthy: stop and start the TPU VM (gcloud "
                "compute tpus tpu-vm stop/start); recreate it if it stays UNHEALTHY",
                backend=B,
            )
        )
    for p in facts.problems:
        out.append(
            DoctorCheck(
                "TPU metadata",
                "warn",
                p,
                "check the VM's network or set TPU_SKIP_MDS_QUERY with TPU_* env (GKE)",
                backend=B,
            )
        )
    return out


def _no_tpu(config: Any, env: dict[str, str], deep: bool) -> list[DoctorCheck]:
    """No TPU: XLA:CPU only when opted in; PJRT_DEVICE=TPU is wrong here."""
    out: list[DoctorCheck] = []
    pjrt = env.get("PJRT_DEVICE", "")
    if cpu_opt_in(config, env):
        out.append(
            DoctorCheck(
                "TPU attached",
                "warn",
                "no TPU found; XLA:CPU opt-in is on (testing only, slow)",
                f"unset {ALLOW_CPU_ENV} / xla.allow_cpu to require a TPU",
                backend=B,
            )
        )
    else:
        out.append(
            DoctorCheck(
                "TPU attached",
                "fail" if deep else "warn",
                "no TPU found (no Google TPU PCI device, no TPU metadata or TPU_* env)",
                f"run on a Cloud TPU VM; to test on XLA:CPU set xla.allow_cpu=true or {ALLOW_CPU_ENV}=1",
                backend=B,
            )
        )
    if pjrt.upper() == "TPU":
        out.append(
            DoctorCheck(
                "PJRT_DEVICE",
                "fail",
                "PJRT_DEVICE=TPU but no TPU is attached",
                "unset PJRT_DEVICE",
                backend=B,
            )
        )
    return out


def _deprecated_env(env: dict[str, str]) -> list[DoctorCheck]:
    """Deprecated variables that silently cast every float tensor."""
    out: list[DoctorCheck] = []
    for name in DEPRECATED_ENV:
        if env.get(name, "").strip() not in ("", "0"):
            out.append(
                DoctorCheck(
                    name,
                    "fail",
                    f"{name}={env[name]} is set (deprecated; silently casts every float tensor)",
                    f"unset {name}; use precision=bf16-mixed or bf16-true",
                    backend=B,
                )
            )
    return out


def _compile_cache(config: Any, facts: Any) -> list[DoctorCheck]:
    """The persistent compilation cache's folder is writable."""
    out: list[DoctorCheck] = []
    s = settings_of(config)
    if facts.present and s.compile_cache:
        d = os.path.expanduser(s.compile_cache_dir)
        parent = d if os.path.isdir(d) else os.path.dirname(d.rstrip("/")) or "."
        ok = os.access(parent, os.W_OK) if os.path.exists(parent) else True
        out.append(
            DoctorCheck(
                "compile cache",
                "pass" if ok else "fail",
                f"persistent compilation cache at {d}",
                "" if ok else "set xla.compile_cache_dir to a writable directory",
                backend=B,
            )
        )
    return out


def _runtime_before_spawn() -> list[DoctorCheck]:
    """Importing torch_xla must leave the XLA runtime uninitialised (torch_xla.launch)."""
    out: list[DoctorCheck] = []
    res = _import_probe()
    if isinstance(res, str):
        out.append(
            DoctorCheck(
                "torch_xla import",
                "fail",
                res,
                "reinstall matching torch and torch_xla",
                backend=B,
            )
        )
    elif res.get("initialized"):
        out.append(
            DoctorCheck(
                "runtime before spawn",
                "fail",
                "importing torch_xla already initialises the XLA runtime here; "
                "torch_xla.launch will fail with 'Runtime is already initialized'",
                "remove XLA device use from sitecustomize / startup hooks (PYTHONSTARTUP, .pth files)",
                backend=B,
            )
        )
    else:
        out.append(
            DoctorCheck(
                "runtime before spawn",
                "pass",
                "importing torch_xla leaves the runtime uninitialised (safe to launch)",
                backend=B,
            )
        )
    return out


def checks(
    config: Any = None, deep: bool = False, environ: dict[str, str] | None = None, facts: Any = None
) -> list[DoctorCheck]:
    env = dict(os.environ) if environ is None else environ
    tv, xv = _ver("torch"), _ver("torch_xla") or _ver("torch-xla")
    out = _install(tv, xv)
    if xv is None or out[0].status == "fail":  # the first check: torch_xla installed
        return out
    out.append(version_set_check("torch_xla", B))
    facts = discover(environ=env) if facts is None else facts
    out += _tpu_present(facts, env, xv) if facts.present else _no_tpu(config, env, deep)
    out += _deprecated_env(env)
    out += _compile_cache(config, facts)
    if deep:
        out += _runtime_before_spawn()
    return out


def version_set_check(
    stack: str, backend: str, versions: dict[str, str | None] | None = None
) -> DoctorCheck:
    """The installed versions against :mod:`aios.plugins.versions` (one line: host, installed, expected)."""
    res = V.check(stack, versions=versions)
    if res.ok:
        note = f"; {res.matched.note}" if res.matched is not None and res.matched.note else ""
        return DoctorCheck("version set", "pass", res.line() + note, backend=backend)
    return DoctorCheck("version set", "fail", res.line(), res.fix(), backend=backend)


T = "tpu"


def tpu_checks(
    config: Any = None,
    deep: bool = False,
    environ: dict[str, str] | None = None,
    facts: Any = None,
    versions: dict[str, str | None] | None = None,
) -> list[DoctorCheck]:
    """``aios doctor`` for ``--backend tpu`` (TorchTPU). Metadata, find_spec and sysfs only: no
    torch, torch_tpu or libtpu import in this process, no metadata-server stall."""

    env = dict(os.environ) if environ is None else environ
    rt = runtime_setting(config, env)
    out: list[DoctorCheck] = []
    if rt == "torch_xla":
        out.append(
            DoctorCheck(
                "xla.runtime",
                "warn" if not deep else "fail",
                "xla.runtime=torch_xla: TorchTPU (--backend tpu) is switched off",
                "set xla.runtime=auto or torch_tpu to use TorchTPU",
                backend=T,
            )
        )
    installed = _tpu_install_checks(rt, deep, env, versions)
    out += installed
    if installed[0].status != "pass":  # no torch_tpu: nothing more to check
        return out
    out += _tpu_device_checks(discover(environ=env) if facts is None else facts, deep, env)
    out += _tpu_cache_check(config)
    return out


def _tpu_install_checks(
    rt: str, deep: bool, env: dict[str, str], versions: dict[str, str | None] | None
) -> list[DoctorCheck]:
    """torch_tpu and libtpu installed, their version set, TorchTPU's autoload switch; the
    first check is torch_tpu's."""
    have = (
        (versions or {}).get("torch_tpu")
        if versions and "torch_tpu" in versions
        else (_ver("torch_tpu") if torch_tpu_installed() else None)
    )
    if not have:
        return [
            DoctorCheck(
                "torch_tpu installed",
                "fail" if deep or rt == "torch_tpu" else "warn",
                "torch_tpu (TorchTPU) is not installed",
                INSTALL,
                backend=T,
            )
        ]
    out = [DoctorCheck("torch_tpu installed", "pass", f"torch_tpu {have}", backend=T)]
    lib = (
        (versions or {}).get("libtpu")
        if versions and "libtpu" in versions
        else (_ver("libtpu") if importlib.util.find_spec("libtpu") else None)
    )
    if not lib:
        out.append(
            DoctorCheck(
                "libtpu",
                "fail",
                "libtpu is not installed: importing torch_tpu would exit the process",
                "pip install 'libtpu>=0.0.50'",
                backend=T,
            )
        )
    out.append(version_set_check("torch_tpu", T, versions))
    if env.get(AUTOLOAD_ENV, "").strip() == "0":
        out.append(
            DoctorCheck(
                "autoload",
                "warn",
                f"{AUTOLOAD_ENV}=0: `import torch` does not load TorchTPU in scripts run without aios-run",
                f"aios-run sets {AUTOLOAD_ENV}=1 for TPU workers; unset it in your shell",
                backend=T,
            )
        )
    return out


def _tpu_device_checks(facts: Any, deep: bool, env: dict[str, str]) -> list[DoctorCheck]:
    """The TPU on this machine, its device files, and the metadata server libtpu waits on."""

    out: list[DoctorCheck] = []
    if facts.present:
        out.append(
            DoctorCheck(
                "TPU attached",
                "pass",
                f"{facts.accelerator_type or 'type unknown'}; {facts.pci_chips} chips on the PCI bus",
                backend=T,
            )
        )
        if not glob.glob("/dev/vfio/[0-9]*") and not glob.glob("/dev/accel*"):
            out.append(
                DoctorCheck(
                    "TPU device files",
                    "warn",
                    "no /dev/vfio/* device files: TorchTPU counts only VFIO-bound chips",
                    "stop and start the TPU VM; recreate it if it stays unhealthy",
                    backend=T,
                )
            )
    else:
        out.append(
            DoctorCheck(
                "TPU attached",
                "fail" if deep else "warn",
                "no TPU found (no Google TPU PCI device, no TPU metadata or TPU_* env)",
                "run on a Cloud TPU VM, or plan one with xla.accelerator=<type> --dry-run",
                backend=T,
            )
        )
    if not on_gce() and SKIP_MDS_ENV not in env:
        out.append(
            DoctorCheck(
                "metadata server",
                "pass",
                f"not on Google Cloud: aios's TPU launcher sets {SKIP_MDS_ENV}=1 so libtpu "
                "does not wait on the metadata server",
                backend=T,
            )
        )
    return out


def _tpu_cache_check(config: Any) -> list[DoctorCheck]:
    """TorchTPU's compilation cache folder, when one is set, is writable."""
    d = settings_of(config).tpu_compile_cache_dir
    if not d:
        return []
    d = os.path.expanduser(d)
    parent = d if os.path.isdir(d) else os.path.dirname(d.rstrip("/")) or "."
    ok = os.access(parent, os.W_OK) if os.path.exists(parent) else True
    return [
        DoctorCheck(
            "compile cache",
            "pass" if ok else "fail",
            f"TorchTPU compilation caches under {d}",
            "" if ok else "set xla.tpu_compile_cache_dir to a writable directory",
            backend=T,
        )
    ]
