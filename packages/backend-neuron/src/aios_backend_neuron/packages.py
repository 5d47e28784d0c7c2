"""What Neuron software is installed, read from package metadata *before* importing anything.

PyPI only has placeholders for the Neuron packages, uploaded by AWS in 2022-2023 so that a plain
``pip install torch-neuronx`` fails loudly instead of installing something unrelated. Their
recorded metadata (inspected from the wheels on PyPI):

=====================  ============  ================================================
distribution           version       what it installs
=====================  ============  ================================================
torch-neuronx          1.0           ``torch_neuronx/__init__.py`` (119 bytes)
neuronx-cc             1.0.post1     ``neuronx-cc/__init__.py`` (not even importable)
neuronx-distributed    0.1           ``neuronx-distributed/__init__.py``
=====================  ============  ================================================

Each long description reads ``WRONG PACKAGE. Please install the package from Neuron
Repository - pip.repos.neuron.amazonaws.com`` and each ``__init__`` raises ``ImportError``.
They declare no ``Requires-Dist``. Real releases come from the Neuron index with versions like
``2.9.0.2.11.19912`` (torch-neuronx on torch_xla: the torch version, then the Neuron release),
``2.14.3.0`` (TorchNeuron, the native backend), ``2.27.5334.0+f702b353`` (neuronx-cc).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import shutil
from dataclasses import dataclass, field

NEURON_INDEX = "https://pip.repos.neuron.amazonaws.com"
INSTALL_LINE = (
    f"pip install --extra-index-url {NEURON_INDEX} torch-neuronx neuronx-cc neuronx-distributed"
)
NEURON_DISTS = ("torch-neuronx", "neuronx-cc", "neuronx-distributed")
# (distribution, version) pairs of the PyPI placeholders.
PLACEHOLDERS = {
    ("torch-neuronx", "1.0"),
    ("neuronx-cc", "1.0.post1"),
    ("neuronx-distributed", "0.1"),
}
PLACEHOLDER_MARK = "WRONG PACKAGE"
# Test seam: extra directories searched for installed distributions (os.pathsep separated).
PATH_ENV = "AIOS_TEST_NEURON_SITE"
# Test seam: run the XLA-based Neuron path on torch_xla's CPU device (PJRT_DEVICE=CPU stands in
# for PJRT_DEVICE=NEURON). Never for real runs: it trains on the CPU.
XLA_CPU_ENV = "AIOS_TEST_NEURON_ON_XLA_CPU"

NATIVE_MIN_TORCH = (2, 10)


@dataclass(frozen=True)
class DistInfo:
    """One installed distribution as its metadata describes it."""

    name: str
    version: str | None  # None: not installed
    placeholder: bool = False
    requires: tuple[str, ...] = ()
    location: str = ""

    @property
    def installed(self) -> bool:
        return self.version is not None

    @property
    def real(self) -> bool:
        return self.installed and not self.placeholder


def _search_path() -> list[str] | None:
    extra = [p for p in os.environ.get(PATH_ENV, "").split(os.pathsep) if p]
    if not extra:
        return None
    import sys

    return extra + list(sys.path)


def _find(name: str, path: list[str] | None) -> md.Distribution | None:
    kwargs = {"name": name} if path is None else {"name": name, "path": path}
    for d in md.distributions(**kwargs):
        return d
    return None


def _field(meta: md.PackageMetadata, key: str) -> str:
    """A metadata field's first value, ``""`` when absent (``get_all``: the form every Python
    from 3.10 types and none warns about)."""
    values = meta.get_all(key)
    return str(values[0]) if values else ""


def is_placeholder(dist: md.Distribution) -> bool:
    """The PyPI placeholder, recognised by its recorded metadata and files (cheap: reads
    METADATA and RECORD text only, and only for the three Neuron names)."""
    meta = dist.metadata
    name = re.sub(r"[-_.]+", "-", _field(meta, "Name")).lower()
    if name not in NEURON_DISTS:
        return False
    version = _field(meta, "Version")
    body = meta.get_payload() if hasattr(meta, "get_payload") else ""
    summary = _field(meta, "Summary")
    if PLACEHOLDER_MARK in str(body) or PLACEHOLDER_MARK in summary:
        return True
    if (name, version) in PLACEHOLDERS and not meta.get_all("Requires-Dist"):
        return True
    record = dist.read_text("RECORD") or ""
    code = [
        ln.split(",", 1)[0] for ln in record.splitlines() if ln.split(",", 1)[0].endswith(".py")
    ]
    # a lone __init__.py, for neuronx-cc / neuronx-distributed in a directory Python cannot import
    return len(code) == 1 and code[0].endswith("__init__.py") and "-" in code[0].split("/", 1)[0]


def inspect(name: str) -> DistInfo:
    """Metadata of ``name`` (never imports it)."""
    dist = _find(name, _search_path())
    if dist is None:
        return DistInfo(name, None)
    reqs = tuple(dist.metadata.get_all("Requires-Dist") or ())
    loc = ""
    try:
        loc = str(dist.locate_file(""))
    except Exception:  # noqa: BLE001
        pass
    version = _field(dist.metadata, "Version") or None
    return DistInfo(name, version, is_placeholder(dist), reqs, loc)


def version_tuple(v: str | None, n: int = 2) -> tuple[int, ...]:
    if not v:
        return ()
    nums = re.findall(r"\d+", v.split("+")[0])
    return tuple(int(x) for x in nums[:n])


def _requires_xla(info: DistInfo) -> bool:
    return any(re.match(r"torch[-_]xla\b", r.strip(), re.I) for r in info.requires)


@dataclass
class NeuronSoftware:
    """Everything the backend needs to know about installed Neuron software."""

    torch: DistInfo
    torch_xla: DistInfo
    torch_neuronx: DistInfo
    neuronx_cc: DistInfo
    neuronx_distributed: DistInfo
    libneuronxla: DistInfo
    xla_cpu_stand_in: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def placeholders(self) -> list[DistInfo]:
        return [
            d
            for d in (self.torch_neuronx, self.neuronx_cc, self.neuronx_distributed)
            if d.placeholder
        ]

    def runtime(self) -> str | None:
        """``xla`` (torch-neuronx on torch_xla), ``native`` (TorchNeuron) or ``None``."""
        if self.xla_cpu_stand_in:
            return "xla" if self.torch_xla.installed else None
        tn = self.torch_neuronx
        if not tn.real:
            return None
        if _requires_xla(tn):
            return "xla"
        # TorchNeuron (native, PrivateUse1 device "neuron") ships for torch 2.10+ and carries the
        # torch version first; the XLA-based releases go up to the torch 2.9 line.
        return "native" if version_tuple(tn.version) >= NATIVE_MIN_TORCH else "xla"

    def runtime_label(self) -> str:
        rt = self.runtime()
        if rt is None:
            return "none"
        if self.xla_cpu_stand_in:
            return f"xla on XLA:CPU (test stand-in {XLA_CPU_ENV}=1, PJRT_DEVICE=CPU; not Trainium)"
        if rt == "xla":
            return (
                f"xla (torch-neuronx {self.torch_neuronx.version} on torch_xla "
                f"{self.torch_xla.version}, device xla, PJRT_DEVICE=NEURON)"
            )
        return f"native (TorchNeuron {self.torch_neuronx.version}, device neuron, process group backend neuron)"

    def version_problems(self) -> list[str]:
        """Mismatches between torch, torch_xla and torch-neuronx (each one line)."""
        out: list[str] = []
        tv = version_tuple(self.torch.version)
        if self.torch_neuronx.real and tv:
            nv = version_tuple(self.torch_neuronx.version)
            if nv and nv != tv:
                out.append(
                    f"torch-neuronx {self.torch_neuronx.version} is built for torch {'.'.join(map(str, nv))}, "
                    f"but torch {self.torch.version} is installed"
                )
        if self.torch_xla.installed and tv and self.runtime() == "xla":
            xv = version_tuple(self.torch_xla.version)
            if xv and xv != tv:
                out.append(
                    f"torch_xla {self.torch_xla.version} does not match torch {self.torch.version}"
                )
        return out


_DETECTED: dict[tuple, NeuronSoftware] = {}


def detect() -> NeuronSoftware:
    """Installed Neuron software, from metadata. Cached per process for the same search path
    and switches (installing packages into a running process needs :func:`forget`)."""
    import sys

    stand_in = os.environ.get(XLA_CPU_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    key = (os.environ.get(PATH_ENV, ""), stand_in, tuple(sys.path))
    if key not in _DETECTED:
        _DETECTED[key] = NeuronSoftware(
            torch=inspect("torch"),
            torch_xla=inspect("torch-xla"),
            torch_neuronx=inspect("torch-neuronx"),
            neuronx_cc=inspect("neuronx-cc"),
            neuronx_distributed=inspect("neuronx-distributed"),
            libneuronxla=inspect("libneuronxla"),
            xla_cpu_stand_in=stand_in,
        )
    return _DETECTED[key]


def forget() -> None:
    """Drop :func:`detect`'s cache."""
    _DETECTED.clear()


def placeholder_message(sw: NeuronSoftware) -> tuple[str, str]:
    names = ", ".join(f"{d.name} {d.version}" for d in sw.placeholders)
    msg = (
        f"{names} from PyPI "
        f'{"is a placeholder" if len(sw.placeholders) == 1 else "are placeholders"} ("WRONG '
        'PACKAGE"), not the AWS Neuron SDK'
    )
    uninstall = " ".join(d.name for d in sw.placeholders)
    return msg, f"run: pip uninstall -y {uninstall} && {INSTALL_LINE}"


def compiler_path() -> str | None:
    """The ``neuronx-cc`` executable, if any (PATH, then the Neuron default)."""
    found = shutil.which("neuronx-cc")
    if found:
        return found
    return None


def module_present(mod: str) -> bool:
    try:
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False
