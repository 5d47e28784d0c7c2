"""TPU discovery without touching the XLA runtime.

A TPU VM is recognised from what it exposes, never by creating an XLA device (that would make a
later ``torch_xla.launch`` fail with "Runtime is already initialized"):

* **sysfs**: PCI devices with Google's vendor id ``0x1ae0`` and a TPU device id
  (:class:`SysfsSource`, root ``/sys/bus/pci/devices``);
* **the GCE metadata server**: ``instance/attributes/{accelerator-type, tpu-env,
  agent-worker-number, worker-network-endpoints}`` (:class:`MetadataSource`; the host comes from
  ``GCE_METADATA_HOST`` like google-auth, default ``metadata.google.internal``; 0.5 s timeout;
  asked only on a GCE machine or when ``GCE_METADATA_HOST`` is set);
* **env vars** set on GKE TPU node pools: ``TPU_ACCELERATOR_TYPE``, ``TPU_WORKER_ID``,
  ``TPU_WORKER_HOSTNAMES``, ``TPU_SKIP_MDS_QUERY`` (:func:`read_env`).

:func:`discover` combines them into :class:`TpuFacts`. Each source is a seam: tests pass a
fake sysfs directory, a local HTTP server as the metadata host, and an env dict.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aios_backend_xla.topology import (
    PCI_DEVICE_IDS,
    TPU_PCI_VENDOR,
    TpuTopology,
    parse_accelerator_type,
)

SYSFS_PCI = "/sys/bus/pci/devices"
DMI_PRODUCT = "/sys/class/dmi/id/product_name"
# Test seams for subprocess tests (``AIOS_TEST_*`` is never read as config): a fake sysfs PCI
# directory and DMI product file. The metadata server's seam is the standard GCE_METADATA_HOST.
SYSFS_ENV = "AIOS_TEST_SYSFS_PCI"
DMI_ENV = "AIOS_TEST_DMI_PRODUCT"
METADATA_HOST = "metadata.google.internal"
METADATA_KEYS = ("accelerator-type", "tpu-env", "agent-worker-number", "worker-network-endpoints")


@dataclass
class TpuFacts:
    """What this machine says about its TPU (all fields optional; nothing initialised)."""

    pci_chips: int = 0
    pci_device_ids: list[str] = field(default_factory=list)
    accelerator_type: str | None = None
    worker_id: int | None = None
    worker_addresses: list[str] = field(default_factory=list)
    tpu_env: dict[str, str] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def present(self) -> bool:
        """A TPU is attached: chips on the PCI bus, or an accelerator type from GKE env / metadata."""
        return self.pci_chips > 0 or self.accelerator_type is not None

    def topology(self) -> TpuTopology | None:
        """The parsed accelerator type, or None when unknown. Raises ConfigError when malformed."""
        return parse_accelerator_type(self.accelerator_type) if self.accelerator_type else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ------------------------------------------------------------------------------ sysfs


class SysfsSource:
    """Counts TPU chips on the PCI bus (``<root>/<bdf>/vendor`` and ``device`` files)."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root or os.environ.get(SYSFS_ENV) or SYSFS_PCI)

    def chips(self) -> list[str]:
        """The PCI device ids of TPU chips found (one entry per chip)."""
        found: list[str] = []
        try:
            entries = sorted(self.root.iterdir())
        except OSError:
            return found
        for dev in entries:
            try:
                vendor = (dev / "vendor").read_text().strip().lower()
                if vendor != TPU_PCI_VENDOR:
                    continue
                device = (dev / "device").read_text().strip().lower()
            except OSError:
                continue
            if device in PCI_DEVICE_IDS:
                found.append(device)
        return found


def on_gce(dmi_path: str | os.PathLike[str] | None = None) -> bool:
    """Whether this is a Google Compute Engine VM (DMI product name), without any network."""
    dmi_path = dmi_path or os.environ.get(DMI_ENV) or DMI_PRODUCT
    try:
        return "google" in Path(dmi_path).read_text().lower()
    except OSError:
        return False


# ------------------------------------------------------------------------------ metadata


class MetadataSource:
    """Reads instance attributes from the GCE metadata server.

    :param host: ``host[:port]``; default ``$GCE_METADATA_HOST`` or ``metadata.google.internal``.
    :param timeout: seconds per request (short: an absent server must not slow ``aios devices``).
    """

    def __init__(self, host: str | None = None, timeout: float = 0.5) -> None:
        self.host = host or os.environ.get("GCE_METADATA_HOST") or METADATA_HOST
        self.timeout = timeout

    @property
    def base_url(self) -> str:
        host = self.host if "://" in self.host else f"http://{self.host}"
        return f"{host.rstrip('/')}/computeMetadata/v1/instance/attributes/"

    def get(self, key: str) -> str | None:
        """The attribute's text, or None when the server answers 404. Raises OSError when the
        server cannot be reached (callers record it and go on)."""
        req = urllib.request.Request(self.base_url + key, headers={"Metadata-Flavor": "Google"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return resp.read().decode("utf-8", "replace").strip()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise OSError(f"metadata server answered HTTP {exc.code} for {key}") from None

    def attributes(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for i, key in enumerate(METADATA_KEYS):
            try:
                value = self.get(key)
            except OSError:
                if i == 0:  # unreachable: don't wait for the other keys too
                    raise
                continue
            if value is not None:
                out[key] = value
        return out


def parse_tpu_env(text: str) -> dict[str, str]:
    """Parse the ``tpu-env`` attribute (``KEY: 'value'`` lines) into a dict of strings."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep or not key.strip() or key.strip().startswith("#"):
            continue
        out[key.strip()] = value.strip().strip("'\"")
    return out


def parse_worker_endpoints(text: str) -> list[str]:
    """``worker-network-endpoints`` is ``hostname:uid:ip,...`` in worker order; return the IPs."""
    out: list[str] = []
    for item in text.split(","):
        parts = item.strip().split(":")
        if len(parts) >= 3 and parts[2]:
            out.append(parts[2])
        elif parts and parts[-1]:
            out.append(parts[-1])
    return out


# ------------------------------------------------------------------------------ env (GKE)


def read_env(environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    acc = environ.get("TPU_ACCELERATOR_TYPE")
    if acc:
        out["accelerator_type"] = acc.strip()
    wid = environ.get("TPU_WORKER_ID") or environ.get("CLOUD_TPU_TASK_ID")
    if wid and wid.strip().isdigit():
        out["worker_id"] = int(wid)
    hosts = environ.get("TPU_WORKER_HOSTNAMES")
    if hosts:
        out["worker_addresses"] = [h.strip() for h in hosts.split(",") if h.strip()]
    tpu_env = {
        k: v
        for k, v in environ.items()
        if k.startswith("TPU_") and k not in ("TPU_WORKER_HOSTNAMES",)
    }
    if tpu_env:
        out["tpu_env"] = tpu_env
    return out


# ------------------------------------------------------------------------------ combine


def discover(
    sysfs: SysfsSource | None = None,
    metadata: MetadataSource | None = None,
    environ: dict[str, str] | None = None,
    dmi_path: str | os.PathLike[str] | None = None,
    use_metadata: bool | None = None,
) -> TpuFacts:
    """Combine sysfs, env and metadata into :class:`TpuFacts`. Never imports torch_xla.

    The metadata server is asked when ``use_metadata`` is true, or (default) when this looks like
    a GCE machine (DMI), TPU chips are on the PCI bus, or ``GCE_METADATA_HOST`` is set, and
    ``TPU_SKIP_MDS_QUERY`` is not (GKE).
    """
    env = dict(os.environ) if environ is None else environ
    facts = TpuFacts()
    ids = (sysfs or SysfsSource(env.get(SYSFS_ENV))).chips()
    if ids:
        facts.pci_chips, facts.pci_device_ids = len(ids), ids
        facts.sources.append("sysfs")

    from_env = read_env(env)
    if "accelerator_type" in from_env or "worker_id" in from_env:
        facts.sources.append("env")
    facts.accelerator_type = from_env.get("accelerator_type")
    facts.worker_id = from_env.get("worker_id")
    facts.worker_addresses = from_env.get("worker_addresses", [])
    facts.tpu_env = from_env.get("tpu_env", {})

    skip = env.get("TPU_SKIP_MDS_QUERY", "").strip().lower() in ("1", "true", "yes")
    if use_metadata is None:
        use_metadata = not skip and (
            bool(ids)
            or bool(env.get("GCE_METADATA_HOST"))
            or metadata is not None
            or on_gce(dmi_path or env.get(DMI_ENV))
        )
    if use_metadata:
        md = metadata or MetadataSource(host=env.get("GCE_METADATA_HOST"))
        try:
            attrs = md.attributes()
        except OSError as exc:
            facts.problems.append(f"metadata server {md.host} unreachable: {exc}")
            attrs = {}
        if attrs:
            facts.sources.append("metadata")
        if "tpu-env" in attrs:
            parsed = parse_tpu_env(attrs["tpu-env"])
            facts.tpu_env = {**parsed, **facts.tpu_env}
            if facts.accelerator_type is None and parsed.get("ACCELERATOR_TYPE"):
                facts.accelerator_type = parsed["ACCELERATOR_TYPE"]
            if facts.worker_id is None and parsed.get("WORKER_ID", "").isdigit():
                facts.worker_id = int(parsed["WORKER_ID"])
        if facts.accelerator_type is None and attrs.get("accelerator-type"):
            facts.accelerator_type = attrs["accelerator-type"]
        if facts.worker_id is None and attrs.get("agent-worker-number", "").isdigit():
            facts.worker_id = int(attrs["agent-worker-number"])
        if not facts.worker_addresses and attrs.get("worker-network-endpoints"):
            facts.worker_addresses = parse_worker_endpoints(attrs["worker-network-endpoints"])
    return facts
