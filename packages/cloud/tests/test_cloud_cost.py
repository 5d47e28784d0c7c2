"""Cost estimates and rankings (6 N T FLOPs at peak x utilisation)."""

from __future__ import annotations

import pytest
from aios.errors import AiosError
from aios_cloud.cost import estimate, hours_cost, parse_count, rank
from aios_cloud.provider.data import CatalogEntry

A = CatalogEntry(
    "x", "fast-8", 8, "chip", 32, peak_tflops=8000, on_demand_hourly=40.0, spot_hourly=12.0
)
B = CatalogEntry(
    "y", "cheap-4", 4, "chip", 16, peak_tflops=1000, on_demand_hourly=4.0, spot_hourly=2.0
)
C = CatalogEntry(
    "y", "tiny-1", 1, "chip", 16, peak_tflops=400, on_demand_hourly=1.0, spot_hourly=None
)


def test_cloud_cost_estimate_formula():
    e = estimate(A, params=1e9, tokens=2e10, precision="bf16", mfu=0.5)
    hours = 6 * 1e9 * 2e10 / (8000e12 * 0.5) / 3600
    assert (
        e.hours == pytest.approx(hours)
        and e.on_demand == pytest.approx(hours * 40)
        and e.spot == pytest.approx(hours * 12)
    )
    assert estimate(A, 1e9, 2e10, "fp32", 0.5).hours == pytest.approx(
        4 * hours
    )  # fp32 runs at a quarter of bf16 peak
    assert e.fits and e.state_gb == pytest.approx(16)
    assert not estimate(C, 7e9, 1e9).fits  # 112 GB of training state on one 16 GB chip


def test_cloud_cost_ranking():
    by_cost = rank([A, B, C], 1e8, 1e10, spot=False)
    assert [e.entry.accelerator for e in by_cost] == [
        "tiny-1",
        "cheap-4",
        "fast-8",
    ]  # on-demand $ per FLOP
    by_spot = rank([A, B, C], 1e8, 1e10, spot=True)
    assert [e.entry.accelerator for e in by_spot][-1] == "tiny-1"  # no spot price sorts last
    by_time = rank([A, B, C], 1e8, 1e10, by="time")
    assert [e.entry.accelerator for e in by_time] == ["fast-8", "cheap-4", "tiny-1"]
    assert "tiny-1" not in [e.entry.accelerator for e in rank([A, B, C], 7e9, 1e9)]
    assert "tiny-1" in [e.entry.accelerator for e in rank([A, B, C], 7e9, 1e9, include_unfit=True)]


def test_cloud_cost_inputs():
    assert (
        parse_count("1.3B", "p") == 1.3e9
        and parse_count("350M", "p") == 3.5e8
        and parse_count("2e12", "p") == 2e12
    )
    for bad in ("lots", "-1", "0"):
        with pytest.raises(AiosError):
            parse_count(bad, "--params")
    with pytest.raises(AiosError, match="unknown precision"):
        estimate(A, 1e9, 1e9, precision="int3")
    with pytest.raises(AiosError, match="outside"):
        estimate(A, 1e9, 1e9, mfu=1.5)
    assert hours_cost(B, 10, nodes=2) == (80.0, 40.0)
