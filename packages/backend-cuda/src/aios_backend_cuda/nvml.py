"""NVML, behind a seam.

Discovery asks NVML (through ``nvidia-ml-py``, imported as ``pynvml``) and never imports torch or
creates a CUDA context, so ``aios devices`` and launch planning stay fast and safe before workers
fork. Everything NVML is asked goes through the :class:`NvmlSource` protocol:

* :class:`PynvmlSource` answers from the real driver (``libnvidia-ml.so``);
* :class:`RecordedNvmlSource` answers from a JSON recording of a real host (the recordings of an
  8x H100 p5.48xlarge, an 8x A100 p4d.24xlarge, a 2x T4 PCIe host and a mixed host live in this
  package's ``tests/recordings``). ``AIOS_TEST_NVML_RECORDING=FILE`` makes every aios command in
  the process use a recording (how the CLI is tested on machines without a GPU).

Indices given to a source are NVML (physical) indices; :func:`visible_indices` maps
``CUDA_VISIBLE_DEVICES`` (indices, ``GPU-`` UUIDs or UUID prefixes) onto them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

RECORDING_ENV = "AIOS_TEST_NVML_RECORDING"

# NVML topology levels (nvmlGpuTopologyLevel_t) and the short names `nvidia-smi topo -m` prints.
TOPOLOGY_LEVELS = {
    "INTERNAL": 0,
    "SINGLE": 10,
    "MULTIPLE": 20,
    "HOSTBRIDGE": 30,
    "NODE": 40,
    "SYSTEM": 50,
}
TOPOLOGY_SHORT = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
TOPOLOGY_MEANING = {
    "NV#": "bonded set of # NVLinks",
    "PIX": "at most one PCIe bridge",
    "PXB": "multiple PCIe bridges, no host bridge",
    "PHB": "PCIe host bridge (same CPU)",
    "NODE": "PCIe + interconnect between host bridges within a NUMA node",
    "SYS": "PCIe + SMP interconnect between NUMA nodes (QPI/UPI)",
}
P2P_OK = 0
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here (bindings missing, no driver library, driver not loaded)."""


@runtime_checkable
class NvmlSource(Protocol):
    """The NVML questions aios asks. Indices are NVML (physical) indices."""

    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...  # e.g. 12040 for CUDA 12.4
    def device_count(self) -> int: ...
    def name(self, i: int) -> str: ...
    def uuid(self, i: int) -> str: ...
    def pci_bus_id(self, i: int) -> str: ...
    def memory(self, i: int) -> tuple[int, int]: ...  # (total, free) bytes
    def compute_capability(self, i: int) -> tuple[int, int]: ...
    def nvlinks(
        self, i: int
    ) -> list[tuple[str, str]]: ...  # active links: (remote type, remote bus id)
    def topology_level(self, i: int, j: int) -> int: ...  # NVML_TOPOLOGY_* between two GPUs
    def p2p_status(self, i: int, j: int, cap: str) -> int: ...  # NVML_P2P_STATUS_*, cap in P2P_CAPS
    def close(self) -> None: ...


def _norm_bus(bus: Any) -> str:
    if isinstance(bus, bytes):
        bus = bus.decode()
    bus = str(bus).strip().lower()
    # NVML gives 00000000:53:00.0 (domain of 8 digits); sysfs/legacy use 0000:53:00.0.
    if bus.count(":") == 2:
        dom, rest = bus.split(":", 1)
        bus = f"{int(dom, 16):08x}:{rest}"
    return bus


class PynvmlSource:
    """The real thing: NVML through ``pynvml`` (package ``nvidia-ml-py``)."""

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NvmlUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
        self._n = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML could not start: {exc}") from exc
        self._handles: dict[int, Any] = {}

    def _h(self, i: int) -> Any:
        if i not in self._handles:
            self._handles[i] = self._n.nvmlDeviceGetHandleByIndex(i)
        return self._handles[i]

    def driver_version(self) -> str:
        v = self._n.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)

    def cuda_driver_version(self) -> int:
        return int(self._n.nvmlSystemGetCudaDriverVersion())

    def device_count(self) -> int:
        return int(self._n.nvmlDeviceGetCount())

    def name(self, i: int) -> str:
        v = self._n.nvmlDeviceGetName(self._h(i))
        return v.decode() if isinstance(v, bytes) else str(v)

    def uuid(self, i: int) -> str:
        v = self._n.nvmlDeviceGetUUID(self._h(i))
        return v.decode() if isinstance(v, bytes) else str(v)

    def pci_bus_id(self, i: int) -> str:
        return _norm_bus(self._n.nvmlDeviceGetPciInfo(self._h(i)).busId)

    def memory(self, i: int) -> tuple[int, int]:
        m = self._n.nvmlDeviceGetMemoryInfo(self._h(i))
        return int(m.total), int(m.free)

    def compute_capability(self, i: int) -> tuple[int, int]:
        major, minor = self._n.nvmlDeviceGetCudaComputeCapability(self._h(i))
        return int(major), int(minor)

    def nvlinks(self, i: int) -> list[tuple[str, str]]:
        n = self._n
        out: list[tuple[str, str]] = []
        h = self._h(i)
        for link in range(n.NVML_NVLINK_MAX_LINKS):
            try:
                if n.nvmlDeviceGetNvLinkState(h, link) != n.NVML_FEATURE_ENABLED:
                    continue
            except n.NVMLError as exc:  # link index past this GPU's links, or no NVLink at all
                if link == 0 and getattr(exc, "value", None) == n.NVML_ERROR_NOT_SUPPORTED:
                    break
                continue
            kind = "gpu"
            try:
                t = n.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
                kind = {
                    n.NVML_NVLINK_DEVICE_TYPE_SWITCH: "switch",
                    n.NVML_NVLINK_DEVICE_TYPE_IBMNPU: "npu",
                }.get(t, "gpu")
            except (n.NVMLError, AttributeError):
                pass
            try:
                bus = _norm_bus(n.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
            except n.NVMLError:
                bus = ""
            out.append((kind, bus))
        return out

    def topology_level(self, i: int, j: int) -> int:
        return int(self._n.nvmlDeviceGetTopologyCommonAncestor(self._h(i), self._h(j)))

    def p2p_status(self, i: int, j: int, cap: str) -> int:
        return int(self._n.nvmlDeviceGetP2PStatus(self._h(i), self._h(j), P2P_CAPS[cap]))

    def close(self) -> None:
        try:
            self._n.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


class RecordedNvmlSource:
    """NVML answers recorded from a real host, loaded from JSON. Format::

    {"description": "...", "driver_version": "550.90.07", "cuda_driver_version": 12040,
     "devices": [{"name": ..., "uuid": "GPU-...", "pci_bus_id": "00000000:53:00.0",
                  "memory_total": bytes, "memory_free": bytes, "compute_capability": [9, 0],
                  "nvlinks": [{"remote": "switch" | "<bus id>", "links": 18}]}],
     "topology": [["INTERNAL", "NODE", ...], ...],     # nvmlDeviceGetTopologyCommonAncestor
     "p2p": {"read": [[0, 0, ...], ...], "nvlink": [[...]]}}   # nvmlDeviceGetP2PStatus
    """

    def __init__(self, data: dict[str, Any], origin: str = "<recording>") -> None:
        self.data = data
        self.origin = origin
        self.devices: list[dict[str, Any]] = list(data.get("devices", []))
        n = len(self.devices)
        topo = data.get("topology") or [
            ["INTERNAL" if a == b else "SYSTEM" for b in range(n)] for a in range(n)
        ]
        self._topo = [
            [TOPOLOGY_LEVELS[str(v).upper()] if isinstance(v, str) else int(v) for v in row]
            for row in topo
        ]
        if len(self._topo) != n or any(len(r) != n for r in self._topo):
            raise ValueError(f"{origin}: topology must be a {n}x{n} matrix")
        self._p2p = data.get("p2p", {})
        self.host = data.get("host", {})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RecordedNvmlSource:
        p = Path(path)
        return cls(json.loads(p.read_text()), origin=str(p))

    def driver_version(self) -> str:
        return str(self.data["driver_version"])

    def cuda_driver_version(self) -> int:
        return int(self.data["cuda_driver_version"])

    def device_count(self) -> int:
        return len(self.devices)

    def name(self, i: int) -> str:
        return str(self.devices[i]["name"])

    def uuid(self, i: int) -> str:
        return str(self.devices[i]["uuid"])

    def pci_bus_id(self, i: int) -> str:
        return _norm_bus(self.devices[i]["pci_bus_id"])

    def memory(self, i: int) -> tuple[int, int]:
        d = self.devices[i]
        return int(d["memory_total"]), int(d.get("memory_free", d["memory_total"]))

    def compute_capability(self, i: int) -> tuple[int, int]:
        major, minor = self.devices[i]["compute_capability"]
        return int(major), int(minor)

    def nvlinks(self, i: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for group in self.devices[i].get("nvlinks", []):
            remote = str(group["remote"])
            kind, bus = ("switch", "") if remote == "switch" else ("gpu", _norm_bus(remote))
            out.extend([(kind, bus)] * int(group.get("links", 1)))
        return out

    def topology_level(self, i: int, j: int) -> int:
        return self._topo[i][j]

    def p2p_status(self, i: int, j: int, cap: str) -> int:
        m = self._p2p.get(cap)
        if m is None:
            return 5  # NVML_P2P_STATUS_NOT_SUPPORTED
        return int(m[i][j])

    def close(self) -> None:
        pass


def open_source() -> NvmlSource:
    """The NVML source for this process: the recording named by ``AIOS_TEST_NVML_RECORDING``
    if set, else the real driver. Raises :class:`NvmlUnavailable`."""
    rec = os.environ.get(RECORDING_ENV)
    if rec:
        return RecordedNvmlSource.load(rec)
    return PynvmlSource()


# ------------------------------------------------------------------------------ visibility


def visible_indices(
    source: NvmlSource, environ: Mapping[str, str] | None = None
) -> tuple[list[int], list[str]]:
    """NVML indices of the GPUs CUDA will see, in CUDA order, honouring ``CUDA_VISIBLE_DEVICES``
    like the CUDA runtime does: comma-separated indices or ``GPU-`` UUIDs (unique prefixes
    allowed); parsing stops at the first invalid entry; unset means all; empty means none.

    :return: (indices, notes) where notes explain entries that were dropped.
    """
    environ = os.environ if environ is None else environ
    count = source.device_count()
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(range(count)), []
    notes: list[str] = []
    out: list[int] = []
    uuids = [source.uuid(i).lower() for i in range(count)]
    for entry in [e.strip() for e in raw.split(",")]:
        if entry == "":
            break
        idx: int | None = None
        low = entry.lower()
        if low.startswith(("gpu-", "mig-")):
            if low.startswith("mig-"):
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} names a MIG instance; aios lists "
                    "the parent GPU only when given by GPU UUID"
                )
                break
            hits = [i for i, u in enumerate(uuids) if u.startswith(low)]
            if len(hits) == 1:
                idx = hits[0]
            else:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} matches "
                    f"{'no' if not hits else 'several'} GPU UUIDs; CUDA ignores it and every "
                    "entry after it"
                )
                break
        else:
            try:
                idx = int(entry)
            except ValueError:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} is neither an index nor a GPU "
                    "UUID; CUDA ignores it and every entry after it"
                )
                break
            if idx < 0 or idx >= count:
                notes.append(
                    f"CUDA_VISIBLE_DEVICES entry {entry!r} is out of range (this host has "
                    f"{count} GPUs); CUDA ignores it and every entry after it"
                )
                break
        if idx in out:
            notes.append(
                f"CUDA_VISIBLE_DEVICES lists GPU {entry!r} twice; CUDA ignores the repeat and every entry after it"
            )
            break
        out.append(idx)
    return out, notes


# ------------------------------------------------------------------------------ discovery


@dataclass
class Gpu:
    """One visible GPU. ``index`` is the CUDA index (what ``cuda:N`` means in this process);
    ``nvml_index`` the physical one."""

    index: int
    nvml_index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int
    memory_free: int
    compute_capability: tuple[int, int]

    @property
    def bf16(self) -> bool:
        """Native bfloat16 (Ampere, compute capability 8.0, and later)."""
        return self.compute_capability >= (8, 0)

    @property
    def cc(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass
class GpuInventory:
    """What NVML says about the GPUs this process can see."""

    driver_version: str
    cuda_driver_version: int
    gpus: list[Gpu]
    links: list[list[str]] = field(default_factory=list)  # nvidia-smi style: X, NV18, PIX, SYS...
    p2p: list[list[str]] = field(default_factory=list)  # OK / NS (not supported) per pair
    notes: list[str] = field(default_factory=list)
    hidden: int = 0  # GPUs on the host that CUDA_VISIBLE_DEVICES hides
    source: str = "nvml"

    @property
    def cuda_version(self) -> str:
        v = self.cuda_driver_version
        return f"{v // 1000}.{(v % 1000) // 10}"

    @property
    def models(self) -> list[str]:
        return sorted({g.name for g in self.gpus})

    @property
    def nvlink_all_pairs(self) -> bool:
        n = len(self.gpus)
        return n > 1 and all(
            self.links[a][b].startswith("NV") for a in range(n) for b in range(n) if a != b
        )

    @property
    def p2p_all_pairs(self) -> bool:
        n = len(self.gpus)
        return n > 1 and all(self.p2p[a][b] == "OK" for a in range(n) for b in range(n) if a != b)


def _nvlink_counts(source: NvmlSource, idx: list[int]) -> dict[tuple[int, int], int]:
    """Active NVLinks between each pair of visible GPUs. Links to an NVSwitch connect a GPU to
    every other GPU on the switch fabric (the count is the links both GPUs have to switches),
    which is what ``nvidia-smi topo -m`` prints as ``NV18`` on an H100 HGX board."""
    bus = {i: source.pci_bus_id(i) for i in idx}
    links = {i: source.nvlinks(i) for i in idx}
    out: dict[tuple[int, int], int] = {}
    for a in idx:
        for b in idx:
            if a == b:
                continue
            direct = sum(1 for kind, rb in links[a] if kind == "gpu" and rb == bus[b])
            sw_a = sum(1 for kind, _ in links[a] if kind == "switch")
            sw_b = sum(1 for kind, _ in links[b] if kind == "switch")
            out[(a, b)] = direct + min(sw_a, sw_b)
    return out


def inventory(source: NvmlSource, environ: Mapping[str, str] | None = None) -> GpuInventory:
    """Everything aios reports about the visible GPUs, from one :class:`NvmlSource`."""
    idx, notes = visible_indices(source, environ)
    total = source.device_count()
    gpus = []
    for cuda_i, i in enumerate(idx):
        mt, mf = source.memory(i)
        gpus.append(
            Gpu(
                cuda_i,
                i,
                source.name(i),
                source.uuid(i),
                source.pci_bus_id(i),
                mt,
                mf,
                source.compute_capability(i),
            )
        )
    nv = _nvlink_counts(source, idx) if len(idx) > 1 else {}
    links: list[list[str]] = []
    p2p: list[list[str]] = []
    for a in idx:
        row, prow = [], []
        for b in idx:
            if a == b:
                row.append("X")
                prow.append("X")
                continue
            n = nv.get((a, b), 0)
            row.append(f"NV{n}" if n else TOPOLOGY_SHORT.get(source.topology_level(a, b), "?"))
            ok = (
                source.p2p_status(a, b, "read") == P2P_OK
                or source.p2p_status(a, b, "nvlink") == P2P_OK
            )
            prow.append("OK" if ok else "NS")
        links.append(row)
        p2p.append(prow)
    inv = GpuInventory(
        driver_version=source.driver_version(),
        cuda_driver_version=source.cuda_driver_version(),
        gpus=gpus,
        links=links,
        p2p=p2p,
        notes=notes,
        hidden=total - len(idx),
        source=getattr(source, "origin", "nvml"),
    )
    if len(inv.models) > 1:
        per = ", ".join(
            f"{g.index}: {g.name} (sm_{g.compute_capability[0]}{g.compute_capability[1]})"
            for g in gpus
        )
        inv.notes.append(
            f"mixed GPU models on this host ({per}); data-parallel ranks run at the pace of the slowest GPU "
            "and bf16 needs every GPU at compute capability 8.0+; restrict with CUDA_VISIBLE_DEVICES"
        )
    if inv.hidden:
        inv.notes.append(
            "CUDA_VISIBLE_DEVICES="
            f"{(environ if environ is not None else os.environ).get('CUDA_VISIBLE_DEVICES')!r} "
            f"hides {inv.hidden} of {total} GPUs"
        )
    if len(gpus) > 1 and not inv.p2p_all_pairs:
        bad = [
            f"{a}-{b}"
            for a in range(len(gpus))
            for b in range(a + 1, len(gpus))
            if p2p[a][b] != "OK"
        ]
        inv.notes.append(
            f"no peer-to-peer access between GPUs {', '.join(bad)}: NCCL goes through host memory (slower all-reduce)"
        )
    return inv


def try_inventory(environ: Mapping[str, str] | None = None) -> tuple[GpuInventory | None, str]:
    """:func:`inventory` from :func:`open_source`, or ``(None, reason)`` when NVML is unusable."""
    try:
        source = open_source()
    except NvmlUnavailable as exc:
        return None, str(exc)
    except (OSError, ValueError, KeyError) as exc:
        return None, f"NVML recording {os.environ.get(RECORDING_ENV)!r} is unreadable: {exc}"
    try:
        return inventory(source, environ), ""
    except Exception as exc:  # noqa: BLE001 - a driver error must not kill `aios devices`
        return None, f"NVML query failed: {type(exc).__name__}: {exc}"
    finally:
        source.close()
