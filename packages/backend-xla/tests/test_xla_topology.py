"""The accelerator-type catalog (pure Python; the cloud-gcp package imports it)."""

from __future__ import annotations

import pytest
from aios.errors import ConfigError
from aios_backend_xla.topology import GENERATIONS, parse_accelerator_type

# type -> (generation, chips, tensorcores, hosts, chips/host, HBM GiB/chip, bf16 TFLOP/s/chip, runtime)
EXPECTED = {
    "v2-8": ("v2", 4, 8, 1, 4, 16, 45.0, "tpu-ubuntu2204-base"),
    "v2-32": ("v2", 16, 32, 4, 4, 16, 45.0, "tpu-ubuntu2204-base"),
    "v3-8": ("v3", 4, 8, 1, 4, 32, 123.0, "tpu-ubuntu2204-base"),
    "v3-32": ("v3", 16, 32, 4, 4, 32, 123.0, "tpu-ubuntu2204-base"),
    "v4-8": ("v4", 4, 8, 1, 4, 32, 275.0, "tpu-ubuntu2204-base"),
    "v4-16": ("v4", 8, 16, 2, 4, 32, 275.0, "tpu-ubuntu2204-base"),
    "v4-32": ("v4", 16, 32, 4, 4, 32, 275.0, "tpu-ubuntu2204-base"),
    "v5litepod-1": ("v5e", 1, 1, 1, 1, 16, 197.0, "v2-alpha-tpuv5-lite"),
    "v5litepod-4": ("v5e", 4, 4, 1, 4, 16, 197.0, "v2-alpha-tpuv5-lite"),
    "v5litepod-8": ("v5e", 8, 8, 1, 8, 16, 197.0, "v2-alpha-tpuv5-lite"),
    "v5litepod-16": ("v5e", 16, 16, 4, 4, 16, 197.0, "v2-alpha-tpuv5-lite"),
    "v5p-8": ("v5p", 4, 8, 1, 4, 95, 459.0, "v2-alpha-tpuv5"),
    "v5p-16": ("v5p", 8, 16, 2, 4, 95, 459.0, "v2-alpha-tpuv5"),
    "v6e-1": ("v6e", 1, 1, 1, 1, 32, 918.0, "v2-alpha-tpuv6e"),
    "v6e-4": ("v6e", 4, 4, 1, 4, 32, 918.0, "v2-alpha-tpuv6e"),
    "v6e-8": ("v6e", 8, 8, 1, 8, 32, 918.0, "v2-alpha-tpuv6e"),
    "v6e-16": ("v6e", 16, 16, 4, 4, 32, 918.0, "v2-alpha-tpuv6e"),
    "v6e-256": ("v6e", 256, 256, 64, 4, 32, 918.0, "v2-alpha-tpuv6e"),
}


@pytest.mark.parametrize("text", sorted(EXPECTED))
def test_known_types(text):
    t = parse_accelerator_type(text)
    gen, chips, cores, hosts, cph, hbm, tflops, rt = EXPECTED[text]
    assert (t.generation, t.chips, t.tensorcores, t.hosts, t.chips_per_host) == (
        gen,
        chips,
        cores,
        hosts,
        cph,
    )
    assert (t.hbm_gib_per_chip, t.bf16_tflops_per_chip, t.runtime_version) == (hbm, tflops, rt)
    assert t.accelerator_type == text
    assert t.hosts * t.chips_per_host == t.chips
    per_chip = 2 if gen == "tpu7x" else 1  # TPU7x: one process per chiplet
    assert t.processes_per_host == t.chips_per_host * per_chip
    assert t.peak_bf16_tflops == pytest.approx(tflops * chips)


def test_v2_v3_show_two_devices_per_chip_and_megacore_one():
    assert parse_accelerator_type("v3-8").devices == 8
    assert parse_accelerator_type("v3-8").devices_per_host == 8
    assert parse_accelerator_type("v4-16").devices == 8
    assert parse_accelerator_type("v5p-8").devices == 4


def test_tpu7x_shows_two_devices_and_runs_two_processes_per_chip():
    """TPU7x's two TensorCores are two chiplets without megacore: two devices per chip (JAX's
    pallas ChipVersion TPU_7X: 2 physical TensorCores, supports_megacore False); torch_xla gives
    the chiplet its own process-bounds axis (pytorch/xla#9586): one process per chiplet."""
    t = parse_accelerator_type("tpu7x-8")  # 4 chips, one VM
    assert (t.chips, t.hosts, t.devices_per_host, t.devices) == (4, 1, 8, 8)
    assert t.processes_per_host == 8 and t.world_size == 8
    t = parse_accelerator_type("tpu7x-32")  # 16 chips, 4 VMs
    assert (t.hosts, t.devices, t.world_size, t.processes_per_host) == (4, 32, 32, 8)


def test_v6e_and_v5e_2x4_come_on_one_or_two_hosts():
    """https://cloud.google.com/tpu/docs/v6e: 2x4 is 8 chips on 1 or 2 VMs."""
    for text in ("v6e-8", "v5litepod-8"):
        t = parse_accelerator_type(text)
        assert t.host_layouts() == [(1, 8), (2, 4)]
        two = t.with_hosts(2)
        assert (two.hosts, two.chips_per_host, two.devices_per_host, two.chips) == (2, 4, 4, 8)
        assert two.processes_per_host == 4 and two.world_size == 8
    assert parse_accelerator_type("v6e-4").host_layouts() == [(1, 4)]
    assert parse_accelerator_type("v6e-16").host_layouts() == [(4, 4)]
    assert parse_accelerator_type("v4-16").host_layouts() == [(2, 4)]


@pytest.mark.parametrize(
    "alias,canonical",
    [
        ("v5e-8", "v5litepod-8"),
        ("V5LITEPOD-4", "v5litepod-4"),
        (" v6e-8 ", "v6e-8"),
        ("tpu-v4-8", "v4-8"),
        ("v5lite-16", "v5litepod-16"),
    ],
)
def test_aliases_normalise(alias, canonical):
    assert parse_accelerator_type(alias).accelerator_type == canonical


@pytest.mark.parametrize(
    "bad,needle",
    [
        ("", "empty"),
        ("v4", "expected <generation>-<number>"),
        ("v4-", "expected"),
        ("v4-abc", "expected"),
        ("x9-8", "unknown TPU generation 'x9'"),
        ("v4-7", "even"),
        ("v4-12", "multiples of 8 TensorCores"),
        ("v4-4", "smallest v4 slice is v4-8"),
        ("v3-16", "v3 is offered as"),
        ("v5litepod-2", "v5e is offered as"),
        ("v6e-12", "v6e is offered as"),
        ("v6e-512", "go up to v6e-256"),
        ("v4-0", "at least 1"),
        ("v4-16-extra", "expected"),
    ],
)
def test_malformed_types_are_one_line_config_errors(bad, needle):
    with pytest.raises(ConfigError) as ei:
        parse_accelerator_type(bad)
    msg = ei.value.one_line()
    assert needle in msg
    assert "\n" not in msg
    assert "e.g. v4-8" in msg


def test_catalog_covers_every_generation_with_positive_facts():
    for gen in GENERATIONS.values():
        assert gen.hbm_gib_per_chip > 0 and gen.bf16_tflops_per_chip > 0
        assert gen.counts in ("tensorcores", "chips")
        t = parse_accelerator_type(f"{gen.type_prefix}-{8 if gen.counts == 'tensorcores' else 4}")
        assert t.generation == gen.name


def test_to_dict_is_json_ready():
    import json

    d = parse_accelerator_type("v4-16").to_dict()
    assert json.loads(json.dumps(d))["hosts"] == 2
    assert d["world_size"] == 8 and d["multi_host"] is True
