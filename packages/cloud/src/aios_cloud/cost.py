"""Cost estimates: hours x price, and a ranking of accelerators for a training job.

Training compute is the usual ``6 * params * tokens`` FLOPs (forward + backward of a dense
transformer). Time on an accelerator type is ``FLOPs / (peak FLOP/s x utilisation)``, where the
peak is the catalog's dense bf16 figure scaled by the precision's throughput factor and the
utilisation (model FLOPs utilisation, MFU) is assumed (default 0.4) or measured by the user
(``--mfu``). Types whose accelerator memory cannot hold the training state (~16 bytes per
parameter with Adam in mixed precision, ~20 in fp32) are flagged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aios.errors import AiosError

from aios_cloud.provider.data import CatalogEntry

# Fraction of the bf16 peak a precision gets (fp32 matmuls run as multi-pass bf16 on TPU and
# without tensor cores on most GPUs). Deliberately conservative.
PRECISION_FACTOR = {"bf16-mixed": 1.0, "bf16-true": 1.0, "fp16-mixed": 1.0, "fp32": 0.25}
PRECISION_ALIASES = {"bf16": "bf16-mixed", "fp16": "fp16-mixed", "32": "fp32", "16": "fp16-mixed"}
BYTES_PER_PARAM = {"bf16-mixed": 16, "fp16-mixed": 16, "bf16-true": 8, "fp32": 16}
DEFAULT_MFU = 0.4

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str | float | int, what: str) -> float:
    """``1.3e9``, ``1.3B``, ``350M``, ``20T`` -> float."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = text.strip().lower().replace("_", "").replace(",", "")
        mult = 1.0
        if s and s[-1] in _SUFFIX:
            mult = _SUFFIX[s[-1]]
            s = s[:-1]
        try:
            value = float(s) * mult
        except ValueError:
            raise AiosError(
                f"{what} '{text}' is not a number", f"write e.g. {what}=1.3B or {what}=1.3e9"
            ) from None
    if not math.isfinite(value) or value <= 0:
        raise AiosError(f"{what} must be positive, got {text}", f"pass a positive {what}")
    return value


def normalise_precision(p: str) -> str:
    p = PRECISION_ALIASES.get(p, p)
    if p not in PRECISION_FACTOR:
        raise AiosError(f"unknown precision '{p}'", f"choose one of: {', '.join(PRECISION_FACTOR)}")
    return p


@dataclass
class Estimate:
    entry: CatalogEntry
    hours: float
    on_demand: float | None
    spot: float | None
    fits: bool
    state_gb: float

    def dollars(self, spot: bool) -> float | None:
        return self.spot if spot else self.on_demand

    def to_dict(self) -> dict:
        return {
            "cloud": self.entry.cloud,
            "accelerator": self.entry.accelerator,
            "devices": self.entry.devices,
            "hours": round(self.hours, 3),
            "on_demand_usd": None if self.on_demand is None else round(self.on_demand, 2),
            "spot_usd": None if self.spot is None else round(self.spot, 2),
            "fits_memory": self.fits,
            "training_state_gb": round(self.state_gb, 1),
            "prices_recorded": (self.entry.extra or {}).get("prices_recorded"),
        }


def training_flops(params: float, tokens: float) -> float:
    return 6.0 * params * tokens


def estimate(
    entry: CatalogEntry,
    params: float,
    tokens: float,
    precision: str = "bf16-mixed",
    mfu: float = DEFAULT_MFU,
) -> Estimate:
    precision = normalise_precision(precision)
    if not 0 < mfu <= 1:
        raise AiosError(
            f"utilisation {mfu} is outside (0, 1]", "pass --mfu as a fraction, e.g. 0.4"
        )
    if not entry.peak_tflops:
        raise AiosError(
            f"{entry.accelerator} has no peak TFLOP/s in the {entry.cloud} catalog",
            "pick another type",
        )
    flops = training_flops(params, tokens)
    rate = entry.peak_tflops * 1e12 * PRECISION_FACTOR[precision] * mfu
    hours = flops / rate / 3600.0
    od = hours * entry.on_demand_hourly if entry.on_demand_hourly is not None else None
    sp = hours * entry.spot_hourly if entry.spot_hourly is not None else None
    state_gb = params * BYTES_PER_PARAM[precision] / 1e9
    fits = state_gb <= entry.memory_gb * entry.devices * 0.9
    return Estimate(entry, hours, od, sp, fits, state_gb)


def rank(
    entries: list[CatalogEntry],
    params: float,
    tokens: float,
    precision: str = "bf16-mixed",
    mfu: float = DEFAULT_MFU,
    spot: bool = False,
    include_unfit: bool = False,
    by: str = "cost",
) -> list[Estimate]:
    """Estimates sorted by dollars (``by="cost"``, spot or on-demand) or hours (``by="time"``);
    types without a price for the chosen pricing sort last."""
    out = []
    for e in entries:
        if not e.peak_tflops:
            continue
        est = estimate(e, params, tokens, precision, mfu)
        if est.fits or include_unfit:
            out.append(est)

    def key(est: Estimate) -> tuple:
        d = est.dollars(spot)
        if by == "time":
            return (est.hours, d if d is not None else math.inf)
        return (d if d is not None else math.inf, est.hours)

    return sorted(out, key=key)


def hours_cost(
    entry: CatalogEntry, hours: float, nodes: int = 1
) -> tuple[float | None, float | None]:
    if hours <= 0:
        raise AiosError(f"--hours must be positive, got {hours}", "pass e.g. --hours 10")
    od = entry.on_demand_hourly * hours * nodes if entry.on_demand_hourly is not None else None
    sp = entry.spot_hourly * hours * nodes if entry.spot_hourly is not None else None
    return od, sp
