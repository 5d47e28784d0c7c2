"""NVML discovery through the seam: recorded answers of real hosts, CUDA_VISIBLE_DEVICES, the
topology matrix, mixed models, and the real pynvml source failing cleanly without a driver."""

from __future__ import annotations

from pathlib import Path

import pytest
from aios_backend_cuda import nvml
from aios_backend_cuda.discovery import interconnect, report

RECORDINGS = Path(__file__).parent / "recordings"


def recording(name: str) -> Path:
    return RECORDINGS / name


def load(name: str) -> nvml.RecordedNvmlSource:
    return nvml.RecordedNvmlSource.load(recording(name))


def test_p5_h100_nvswitch_all_pairs_nv18() -> None:
    inv = nvml.inventory(load("p5.48xlarge-8xh100.json"), environ={})
    assert len(inv.gpus) == 8
    assert inv.models == ["NVIDIA H100 80GB HBM3"]
    assert all(g.compute_capability == (9, 0) and g.bf16 for g in inv.gpus)
    assert inv.gpus[0].memory_total == 85520809984
    assert inv.cuda_version == "12.2" and inv.driver_version == "535.183.01"
    for a in range(8):
        for b in range(8):
            assert inv.links[a][b] == ("X" if a == b else "NV18")
    assert inv.nvlink_all_pairs and inv.p2p_all_pairs
    assert interconnect(inv) == "NVLink between all pairs (NV18)"
    assert not inv.notes


def test_p4d_a100_nv12() -> None:
    inv = nvml.inventory(load("p4d.24xlarge-8xa100.json"), environ={})
    assert {inv.links[0][b] for b in range(1, 8)} == {"NV12"}
    assert inv.gpus[3].pci_bus_id == "00000000:20:1d.0"
    assert all(g.cc == "8.0" for g in inv.gpus)


def test_pcie_pair_without_p2p_is_reported() -> None:
    inv = nvml.inventory(load("pcie-2xt4.json"), environ={})
    assert inv.links == [["X", "PHB"], ["PHB", "X"]]
    assert inv.p2p == [["X", "NS"], ["NS", "X"]]
    assert not inv.p2p_all_pairs
    assert interconnect(inv) == "PCIe only (PHB)"
    assert any("no peer-to-peer access between GPUs 0-1" in n for n in inv.notes)
    assert not any(g.bf16 for g in inv.gpus)


def test_mixed_models_are_named() -> None:
    inv = nvml.inventory(load("mixed-4090-1080ti.json"), environ={})
    assert inv.models == ["NVIDIA GeForce GTX 1080 Ti", "NVIDIA GeForce RTX 4090"]
    note = next(n for n in inv.notes if n.startswith("mixed GPU models"))
    assert "sm_89" in note and "sm_61" in note


def test_partial_nvlink_mesh_counts_direct_links() -> None:
    # a DGX-1-like partial mesh: 0-1 two links, 0-2 one link, 1-2 no NVLink (PCIe across sockets)
    bus = ["00000000:06:00.0", "00000000:07:00.0", "00000000:0a:00.0"]
    data = {
        "driver_version": "470.199.02",
        "cuda_driver_version": 11040,
        "devices": [
            {
                "name": "Tesla V100-SXM2-16GB",
                "uuid": f"GPU-{i}aaa",
                "pci_bus_id": bus[i],
                "memory_total": 17179869184,
                "compute_capability": [7, 0],
                "nvlinks": links,
            }
            for i, links in enumerate(
                [
                    [{"remote": bus[1], "links": 2}, {"remote": bus[2], "links": 1}],
                    [{"remote": bus[0], "links": 2}],
                    [{"remote": bus[0], "links": 1}],
                ]
            )
        ],
        "topology": [
            ["INTERNAL", "MULTIPLE", "SYSTEM"],
            ["MULTIPLE", "INTERNAL", "SYSTEM"],
            ["SYSTEM", "SYSTEM", "INTERNAL"],
        ],
        "p2p": {"read": [[0, 0, 0], [0, 0, 1], [0, 1, 0]]},
    }
    inv = nvml.inventory(nvml.RecordedNvmlSource(data), environ={})
    assert inv.links[0] == ["X", "NV2", "NV1"]
    assert inv.links[1][2] == "SYS" and inv.links[2][1] == "SYS"
    assert interconnect(inv) == "NVLink between 2 of 3 pairs, PCIe for the rest"
    assert inv.p2p[1][2] == "NS" and inv.p2p[0][1] == "OK"


@pytest.mark.parametrize(
    ("visible", "expected"),
    [
        ("3,1", [3, 1]),
        ("GPU-e07c4b19,GPU-3b5f2a3e-8f6c-1d27-4f4a-0c3e2b9a7d11", [3, 0]),
        ("2,9,1", [2]),  # out of range: CUDA stops at the first bad entry
        ("1,foo,2", [1]),
        ("", []),
        ("0,0", [0]),
    ],
)
def test_cuda_visible_devices(visible: str, expected: list[int]) -> None:
    src = load("p5.48xlarge-8xh100.json")
    idx, notes = nvml.visible_indices(src, {"CUDA_VISIBLE_DEVICES": visible})
    assert idx == expected
    if visible in ("2,9,1", "1,foo,2", "0,0"):
        assert notes and "CUDA_VISIBLE_DEVICES" in notes[0]


def test_visible_devices_renumber_and_topology_follows() -> None:
    inv = nvml.inventory(load("p4d.24xlarge-8xa100.json"), environ={"CUDA_VISIBLE_DEVICES": "5,2"})
    assert [(g.index, g.nvml_index) for g in inv.gpus] == [(0, 5), (1, 2)]
    assert inv.hidden == 6
    assert inv.links == [["X", "NV12"], ["NV12", "X"]]
    assert any("hides 6 of 8" in n for n in inv.notes)


def test_ambiguous_uuid_prefix_is_rejected() -> None:
    src = load("p5.48xlarge-8xh100.json")
    idx, notes = nvml.visible_indices(src, {"CUDA_VISIBLE_DEVICES": "GPU-"})
    assert idx == [] and "several" in notes[0]


def test_real_pynvml_source_without_driver_fails_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        pytest.skip("nvidia-ml-py is not installed")
    monkeypatch.delenv("AIOS_TEST_NVML_RECORDING", raising=False)
    try:
        src = nvml.PynvmlSource()
    except nvml.NvmlUnavailable as exc:
        assert "NVML" in str(exc)
        inv, why = nvml.try_inventory()
        assert inv is None and why
        return
    # a machine with a driver: the real source must answer the protocol
    try:
        assert isinstance(src, nvml.NvmlSource)
        n = src.device_count()
        inv = nvml.inventory(src, environ={})
        assert len(inv.gpus) == n
        assert all(g.memory_total > 0 for g in inv.gpus)
    finally:
        src.close()


def test_recorded_source_satisfies_protocol() -> None:
    assert isinstance(load("pcie-2xt4.json"), nvml.NvmlSource)


def test_report_from_recording(recorded_host) -> None:
    recorded_host("p5.48xlarge-8xh100.json", torch_version="2.4.0+cu121")
    rep = report()
    assert rep.available and rep.kind == "NVIDIA GPU" and rep.count == 8
    links = rep.topology["links"]
    assert links[0] == ["", *(f"GPU{i}" for i in range(8))]
    assert links[1][:3] == ["GPU0", "X", "NV18"]
    assert rep.topology["p2p_matrix"][2][1] == "OK"
    assert rep.devices[0].extra["compute_capability"] == "9.0"
    assert rep.topology["cuda_driver"] == "12.2"


def test_report_amd_gpu_named_as_rocm(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from aios_backend_cuda import discovery, probe

    monkeypatch.delenv("AIOS_TEST_NVML_RECORDING", raising=False)
    monkeypatch.setattr(
        nvml, "open_source", lambda: (_ for _ in ()).throw(nvml.NvmlUnavailable("no NVML"))
    )
    node = tmp_path / "nodes" / "1"
    (node / "mem_banks" / "0").mkdir(parents=True)
    (node / "properties").write_text(
        "cpu_cores_count 0\nsimd_count 440\ngfx_target_version 90010\n"
    )
    (node / "name").write_text("gfx90a\n")
    (node / "mem_banks" / "0" / "properties").write_text("heap_type 1\nsize_in_bytes 68702699520\n")
    cpu = tmp_path / "nodes" / "0"
    cpu.mkdir()
    (cpu / "properties").write_text("cpu_cores_count 64\nsimd_count 0\n")
    monkeypatch.setattr(discovery, "KFD_TOPOLOGY", str(tmp_path / "nodes"))
    kfd = tmp_path / "kfd"
    kfd.write_text("")
    monkeypatch.setattr(probe, "KFD_PATHS", (str(kfd),))
    monkeypatch.setattr(probe, "PROC_NVIDIA_GPUS", str(tmp_path / "no-nvidia"))
    rep = discovery.report()
    assert rep.kind == "AMD GPU (ROCm)" and not rep.available
    assert (
        rep.count == 1
        and rep.devices[0].name == "gfx90a"
        and rep.devices[0].memory_bytes == 68702699520
    )
    assert "ROCm" in rep.reason and "NVIDIA" in rep.reason
    avail = probe.probe()
    assert not avail and "AMD" in avail.reason and "ROCm" in avail.reason
