"""Shared fixtures for aios-backend-cuda tests: recorded NVML hosts and a clean environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

RECORDINGS = Path(__file__).parent / "recordings"


def recording(name: str) -> Path:
    return RECORDINGS / name


@pytest.fixture
def recorded_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``use(name, torch_version=None)``: make this process see a recorded NVML host; with
    ``torch_version`` the recorded host also says which torch build it runs."""

    def use(name: str, torch_version: str | None = None) -> Path:
        src = recording(name)
        if torch_version is not None:
            data = json.loads(src.read_text())
            data["host"] = {"torch_version": torch_version}
            dst = tmp_path / name
            dst.write_text(json.dumps(data))
            src = dst
        monkeypatch.setenv("AIOS_TEST_NVML_RECORDING", str(src))
        return src

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return use
