"""The Cloud TPU catalog: accelerator types, chips, hosts, HBM, runtime version, prices, zones.

Topology facts (chips, hosts, HBM, peak bf16 TFLOP/s, runtime version per generation) come from
:mod:`aios_backend_xla.topology`; this module adds what only the cloud side knows: list prices
and the zones that offer each generation. Prices are public list prices per chip-hour
(us-central regions, USD, approximate, change over time; override with ``gcp.prices``).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from aios_backend_xla import topology
from aios_cloud.provider.data import CatalogEntry

# USD per chip-hour: (on demand, spot). TPU7x has no price here: none was published in a source
# aios could check (set gcp.prices.tpu7x=[ON_DEMAND, SPOT] to have aios cost/plan use yours).
PRICES: dict[str, tuple[float, float]] = {
    "v2": (1.125, 0.3375),
    "v3": (2.00, 0.60),
    "v4": (3.22, 1.45),
    "v5e": (1.20, 0.42),
    "v5p": (4.20, 1.89),
    "v6e": (2.70, 0.95),
}

# Zones offering each generation, in failover order (https://cloud.google.com/tpu/docs/regions-zones,
# checked 2026-11; a zone listed here that does not offer the type is skipped by the failover,
# never fatal). v2-8 is in us-central1-b/c/f, the v2 pods (v2-32 and up) in us-central1-a; the
# v6e/v5p zones marked single-tenant there take reservations.
ZONES: dict[str, tuple[str, ...]] = {
    "v2": (
        "us-central1-b",
        "us-central1-c",
        "us-central1-f",
        "us-central1-a",
        "europe-west4-a",
        "asia-east1-c",
    ),
    "v3": ("us-central1-a", "us-central1-b", "us-central1-f", "europe-west4-a"),
    "v4": ("us-central2-b",),
    "v5e": (
        "us-west4-a",
        "us-central1-a",
        "us-south1-a",
        "us-west1-c",
        "us-east5-a",
        "us-east5-b",
        "us-east5-c",
        "europe-west4-b",
        "asia-southeast1-b",
    ),
    "v5p": (
        "us-east5-a",
        "us-central1-a",
        "us-east5-b",
        "us-east5-c",
        "us-south1-a",
        "europe-west4-b",
    ),
    "v6e": (
        "us-east5-b",
        "us-east5-a",
        "us-east1-d",
        "us-central1-b",
        "us-east5-c",
        "us-east4-a",
        "us-east4-b",
        "us-west1-c",
        "europe-west4-a",
        "asia-northeast1-b",
    ),
}

# Generations the Cloud TPU API does not serve: "To use TPU7x, you can use Google Kubernetes
# Engine (GKE) or Compute Engine" (https://cloud.google.com/tpu/docs/tpu7x). aios plans them
# through GKE (``--cloud k8s``, a node pool labelled cloud.google.com/gke-tpu-accelerator=tpu7x).
GKE_ONLY = {"tpu7x"}

# The types listed by `aios catalog` (any valid type string works with --accelerator).
LISTED: dict[str, tuple[int, ...]] = {
    "v2": (8, 32),
    "v3": (8, 32),
    "v4": (8, 16, 32, 64, 128),
    "v5e": (1, 4, 8, 16, 32, 64, 128, 256),
    "v5p": (8, 16, 32, 64, 128),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
    "tpu7x": (8, 16, 32, 64, 128),  # listed with its route: GKE (--cloud k8s), never the TPU API
}


def _topology() -> ModuleType:
    return topology


def entry_for(accelerator: str, settings: Any = None) -> CatalogEntry:
    """Catalog entry for any valid type string (``v4-16``, ``v5litepod-8``, ``v6e-4``).
    Raises :class:`aios.errors.ConfigError` (one line) for an unknown or impossible type."""
    topo = _topology().parse_accelerator_type(accelerator)
    gen = topo.generation
    prices = dict(PRICES)
    zones = dict(ZONES)
    if settings is not None:
        prices.update({k: tuple(v) for k, v in (settings.prices or {}).items()})
        zones.update({k: tuple(v) for k, v in (settings.zones or {}).items()})
    od, spot = prices.get(gen, (None, None))
    return CatalogEntry(
        cloud="gcp",
        accelerator=topo.accelerator_type,
        devices=topo.chips,
        device_kind=f"TPU {gen} chip",
        memory_gb=float(topo.hbm_gib_per_chip) * 1.073741824,
        hosts=topo.hosts,
        runtime=topo.runtime_version if gen not in GKE_ONLY else "GKE node pool (--cloud k8s)",
        on_demand_hourly=round(od * topo.chips, 4) if od is not None else None,
        spot_hourly=round(spot * topo.chips, 4) if spot is not None else None,
        peak_tflops=topo.bf16_tflops_per_chip * topo.chips,
        zones=tuple(zones.get(gen, ())),
        backend="xla",
    )


def catalog(settings: Any = None) -> list[CatalogEntry]:
    t = _topology()
    out = []
    for gen, sizes in LISTED.items():
        prefix = t.GENERATIONS[gen].type_prefix
        for size in sizes:
            out.append(entry_for(f"{prefix}-{size}", settings))
    return out


def generation(accelerator: str) -> str:
    return _topology().parse_accelerator_type(accelerator).generation
