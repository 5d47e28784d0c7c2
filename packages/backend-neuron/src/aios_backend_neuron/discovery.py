"""Neuron device discovery through ``neuron-ls``, without touching the Neuron runtime.

The seam is the ``neuron-ls`` executable itself: the real tool on a Trainium instance, and in
tests a stand-in on ``PATH`` that prints a recorded ``neuron-ls --json-output`` capture
(``tests/fixtures/neuron_ls_*.json``). Nothing else is faked.

``neuron-ls --json-output`` prints a JSON array with one object per Neuron device::

    {"neuron_device": 0, "bdf": "0000:00:1e.0", "cpu_affinity": "0-7", "numa_node": "-1",
     "connected_to": null, "nc_count": 2, "memory_size": 34359738368,
     "neuroncore_ids": [0, 1], "neuron_processes": []}

Newer tools add ``instance_type``, ``instance_id`` and (Trn2) ``logical_neuroncore_config``;
``nc_count`` and ``neuroncore_ids`` count *logical* cores (on Trn2 with LNC=2, 4 per device
made of 8 physical cores). Neuron 2.34 replaces ``--json-output`` with ``--output-format json``
(a top-level object); both shapes are read.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from aios.errors import ConfigError

from aios_backend_neuron.catalog import InstanceType, family_defaults

DEFAULT_NEURON_LS = "/opt/aws/neuron/bin/neuron-ls"
TIMEOUT_S = 30.0


class NeuronLsError(Exception):
    """``neuron-ls`` ran but its answer could not be used."""


# ------------------------------------------------------------------------------ core lists


def parse_core_list(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (the ``NEURON_RT_VISIBLE_CORES`` syntax).

    Raises ``ValueError`` naming the bad part."""
    out: list[int] = []
    s = str(text).replace(" ", "")
    if not s:
        raise ValueError("empty core list")
    for part in s.split(","):
        if not part:
            raise ValueError(f"empty item in core list '{text}'")
        if "-" in part:
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and hi.isdigit()):
                raise ValueError(f"'{part}' in core list '{text}' is not a range like 0-3")
            a, b = int(lo), int(hi)
            if b < a:
                raise ValueError(f"range '{part}' in core list '{text}' runs backwards")
            out.extend(range(a, b + 1))
        else:
            if not part.isdigit():
                raise ValueError(f"'{part}' in core list '{text}' is not a core id")
            out.append(int(part))
    if len(set(out)) != len(out):
        raise ValueError(f"core list '{text}' names a core twice")
    return sorted(out)


def format_core_list(cores: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    cores = sorted(cores)
    parts: list[str] = []
    i = 0
    while i < len(cores):
        j = i
        while j + 1 < len(cores) and cores[j + 1] == cores[j] + 1:
            j += 1
        parts.append(str(cores[i]) if i == j else f"{cores[i]}-{cores[j]}")
        i = j + 1
    return ",".join(parts)


# ------------------------------------------------------------------------------ model


@dataclass
class NeuronDevice:
    index: int
    cores: int  # logical NeuronCores at the reported logical-core config
    core_ids: list[int]
    memory_bytes: int
    bdf: str = ""
    numa_node: int = -1
    cpu_affinity: str = ""
    connected_to: list[int] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class NeuronTopology:
    """What one instance has, as neuron-ls reports it (or as the catalog describes it)."""

    devices: list[NeuronDevice]
    lnc: int = 1
    instance_type: str | None = None
    instance_id: str | None = None
    source: str = "neuron-ls"

    @property
    def core_ids(self) -> list[int]:
        return [c for d in self.devices for c in d.core_ids]

    @property
    def logical_cores(self) -> int:
        return sum(d.cores for d in self.devices)

    @property
    def physical_cores(self) -> int:
        return self.logical_cores * self.lnc

    @property
    def cores_per_device(self) -> int:
        return self.devices[0].cores if self.devices else 0

    @property
    def facts(self) -> InstanceType | None:
        return family_defaults(self.instance_type)

    def with_lnc(self, lnc: int) -> NeuronTopology:
        """The same hardware seen with another logical-core config (core ids renumbered)."""
        if lnc == self.lnc:
            return self
        devices = []
        next_id = 0
        for d in self.devices:
            physical = d.cores * self.lnc
            if physical % lnc:
                raise ConfigError(
                    f"logical core config {lnc} does not divide the {physical} physical "
                    f"NeuronCores of device {d.index}",
                    "set neuron.logical_nc_config to 1 or 2 (Trn2) or leave it unset",
                )
            n = physical // lnc
            devices.append(
                NeuronDevice(
                    d.index,
                    n,
                    list(range(next_id, next_id + n)),
                    d.memory_bytes,
                    d.bdf,
                    d.numa_node,
                    d.cpu_affinity,
                    list(d.connected_to),
                    list(d.processes),
                )
            )
            next_id += n
        return NeuronTopology(devices, lnc, self.instance_type, self.instance_id, self.source)

    @classmethod
    def from_catalog(cls, facts: InstanceType, lnc: int | None = None) -> NeuronTopology:
        lnc = lnc or facts.default_lnc
        per = facts.logical_cores_per_device(lnc)
        devices = [
            NeuronDevice(i, per, list(range(i * per, (i + 1) * per)), facts.memory_per_device)
            for i in range(facts.devices)
        ]
        return cls(devices, lnc, facts.name, None, source="catalog")


# ------------------------------------------------------------------------------ parsing


def _as_int(v: Any, default: int = -1) -> int:
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        return default


def _memory(v: Any) -> int:
    if isinstance(v, (int, float)):
        return int(v)
    s = str(v or "").strip().upper().replace(" ", "")
    for unit, mult in (("GB", 1024**3), ("GIB", 1024**3), ("MB", 1024**2), ("MIB", 1024**2)):
        if s.endswith(unit) and s[: -len(unit)].replace(".", "", 1).isdigit():
            return int(float(s[: -len(unit)]) * mult)
    return _as_int(s, 0)


def parse_neuron_ls(payload: Any, env_lnc: int | None = None) -> NeuronTopology:
    """Parse ``neuron-ls`` JSON (already decoded): the ``--json-output`` array or the
    ``--output-format json`` object. Raises :class:`NeuronLsError` on an unusable shape."""
    top: dict[str, Any] = {}
    rows: Any = payload
    if isinstance(payload, dict):
        top = payload
        rows = None
        for key in ("neuron_devices", "devices", "neuron_device_info"):
            if isinstance(payload.get(key), list):
                rows = payload[key]
                break
        if rows is None:
            raise NeuronLsError(
                f"neuron-ls JSON object has no device list (keys: {', '.join(sorted(payload))})"
            )
    if not isinstance(rows, list):
        raise NeuronLsError(
            f"neuron-ls JSON is a {type(payload).__name__}, expected a list of devices"
        )
    info_raw = top.get("instance_info")
    info: dict[str, Any] = info_raw if isinstance(info_raw, dict) else {}
    instance_type = top.get("instance_type") or info.get("instance_type")
    instance_id = top.get("instance_id") or info.get("instance_id")
    lnc_top = top.get("logical_neuroncore_config")
    devices: list[NeuronDevice] = []
    lnc_seen: set[int] = set()
    next_id = 0
    for row in rows:
        if not isinstance(row, dict):
            raise NeuronLsError("neuron-ls JSON device entry is not an object")
        if "neuron_device" not in row:
            raise NeuronLsError("neuron-ls JSON device entry lacks 'neuron_device'")
        ids = [int(c) for c in (row.get("neuroncore_ids") or [])]
        n = _as_int(row.get("nc_count"), len(ids))
        if n <= 0 and not ids:
            raise NeuronLsError(
                f"neuron-ls reports no NeuronCores for device {row.get('neuron_device')}"
            )
        if not ids:
            ids = list(range(next_id, next_id + n))
        next_id = max(ids) + 1
        instance_type = instance_type or row.get("instance_type")
        instance_id = instance_id or row.get("instance_id")
        if row.get("logical_neuroncore_config") is not None:
            lnc_seen.add(_as_int(row["logical_neuroncore_config"], 1))
        devices.append(
            NeuronDevice(
                index=_as_int(row["neuron_device"], len(devices)),
                cores=n,
                core_ids=ids,
                memory_bytes=_memory(row.get("memory_size")),
                bdf=str(row.get("bdf") or ""),
                numa_node=_as_int(row.get("numa_node")),
                cpu_affinity=str(row.get("cpu_affinity") or ""),
                connected_to=[int(x) for x in (row.get("connected_to") or [])],
                processes=list(row.get("neuron_processes") or []),
            )
        )
    if len(lnc_seen) > 1:
        raise NeuronLsError(f"neuron-ls reports mixed logical core configs {sorted(lnc_seen)}")
    if lnc_seen:
        lnc = lnc_seen.pop()
    elif lnc_top is not None:
        lnc = _as_int(lnc_top, 1)
    else:
        facts = family_defaults(instance_type)
        lnc = env_lnc or (facts.default_lnc if facts else 1)
    return NeuronTopology(devices, lnc, instance_type, instance_id, source="neuron-ls")


# ------------------------------------------------------------------------------ the seam


def find_neuron_ls(configured: str | None = None) -> str | None:
    """The ``neuron-ls`` to run: the configured path, then ``PATH``, then the Neuron default."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("neuron-ls")
    if found:
        return found
    return DEFAULT_NEURON_LS if os.access(DEFAULT_NEURON_LS, os.X_OK) else None


def device_nodes() -> list[str]:
    """``/dev/neuron*`` character devices (present when the Neuron driver is loaded)."""
    return sorted(glob.glob("/dev/neuron[0-9]*"))


@dataclass
class NeuronLsResult:
    path: str | None
    topology: NeuronTopology | None = None
    error: str = ""


_CACHE: dict[tuple, NeuronLsResult] = {}


def _env_lnc() -> int | None:
    v = os.environ.get("NEURON_LOGICAL_NC_CONFIG", "").strip()
    return int(v) if v in ("1", "2") else None


def run_neuron_ls(configured: str | None = None, use_cache: bool = True) -> NeuronLsResult:
    """Run ``neuron-ls`` and parse its JSON. Never raises: failures come back in ``error``."""
    path = find_neuron_ls(configured)
    if path is None:
        where = configured or f"PATH or {DEFAULT_NEURON_LS}"
        return NeuronLsResult(
            None, error=f"neuron-ls not found ({where}); it comes with aws-neuronx-tools"
        )
    try:
        st = os.stat(path)
        key: tuple = (path, st.st_mtime_ns, st.st_size, os.environ.get("NEURON_LOGICAL_NC_CONFIG"))
    except OSError:
        key = (path,)
    if use_cache and key in _CACHE:
        return _CACHE[key]
    result = _run(path)
    _CACHE[key] = result
    return result


def _run(path: str) -> NeuronLsResult:
    last_err = ""
    for args in (["--json-output"], ["--output-format", "json"]):
        try:
            proc = subprocess.run(
                [path, *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            return NeuronLsResult(path, error=f"{path} did not answer within {TIMEOUT_S:.0f}s")
        except OSError as exc:
            return NeuronLsResult(path, error=f"{path} could not run: {exc}")
        out = proc.stdout.strip()
        if proc.returncode == 0 and out:
            try:
                payload = json.loads(out)
            except json.JSONDecodeError as exc:
                return NeuronLsResult(
                    path,
                    error=f"{path} {' '.join(args)} printed invalid JSON ({exc.msg} at line {exc.lineno})",
                )
            try:
                return NeuronLsResult(path, parse_neuron_ls(payload, _env_lnc()))
            except NeuronLsError as exc:
                return NeuronLsResult(path, error=str(exc))
        err = (proc.stderr or proc.stdout).strip().splitlines()
        last_err = err[-1] if err else f"exit status {proc.returncode}"
        low = last_err.lower()
        if not any(
            w in low
            for w in (
                "unknown",
                "unrecognized",
                "invalid option",
                "usage",
                "flag provided but not defined",
            )
        ):
            break  # a real failure (e.g. no driver), not an unsupported flag
    if "discover" in last_err.lower() or "no neuron device" in last_err.lower():
        return NeuronLsResult(path, error=f"no Neuron devices: {last_err}")
    return NeuronLsResult(path, error=f"{path} failed: {last_err}")


def clear_cache() -> None:
    _CACHE.clear()


# ------------------------------------------------------------------------------ selection


def visible_core_ids(topology: NeuronTopology, spec: str | None, origin: str) -> list[int]:
    """Apply a ``NEURON_RT_VISIBLE_CORES`` value to ``topology``; a core id the instance does
    not have is a :class:`ConfigError`."""
    all_ids = topology.core_ids
    if not spec:
        return list(all_ids)
    try:
        wanted = parse_core_list(spec)
    except ValueError as exc:
        raise ConfigError(f"{origin}: {exc}", "write core ids and ranges like 0-3,8") from None
    have = set(all_ids)
    missing = [c for c in wanted if c not in have]
    if missing:
        rng = format_core_list(all_ids) if all_ids else "none"
        raise ConfigError(
            f"{origin} names NeuronCore{'s' if len(missing) > 1 else ''} {format_core_list(missing)}, "
            f"but this instance has logical cores {rng} (LNC={topology.lnc})",
            f"pick cores within {rng}",
        )
    return wanted
