"""Fixtures for aios-backend-neuron tests.

* ``fake_neuron_ls``: puts a ``neuron-ls`` executable first on ``PATH`` that prints a recorded
  ``neuron-ls --json-output`` capture (``fixtures/neuron_ls_<instance>.json``). This is the seam
  the real discovery uses (it runs whatever ``neuron-ls`` is found), so nothing else is faked.
* ``neuron_site``: a directory of installed-distribution metadata added to the metadata search
  path through ``AIOS_TEST_NEURON_SITE``: the recorded PyPI placeholders
  (``fixtures/pypi_placeholders``, unpacked from the real wheels) or Neuron-index releases
  described by their metadata.
* the ``xla`` marker skips with a reason when torch_xla is absent; ``neuron`` when no Neuron
  device is attached.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
HAS_NEURON = (
    bool(glob.glob("/dev/neuron[0-9]*")) and importlib.util.find_spec("torch_neuronx") is not None
)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(str(item.fspath)).parents:
            continue
        if "xla" in item.keywords and not HAS_TORCH_XLA:
            item.add_marker(
                pytest.mark.skip(
                    reason="torch_xla not installed (run in the torch_xla environment)"
                )
            )
        if "neuron" in item.keywords and not HAS_NEURON:
            item.add_marker(
                pytest.mark.skip(
                    reason="no Neuron device with torch-neuronx here (needs a Trainium instance)"
                )
            )


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """Tests start without Neuron variables from the caller's shell and with fresh caches."""
    for k in list(os.environ):
        if k.startswith(
            (
                "NEURON_",
                "AIOS_NEURON",
                "AIOS_TEST_NEURON",
                "XLA_USE_BF16",
                "XLA_DOWNCAST_BF16",
                "PJRT_DEVICE",
            )
        ):
            monkeypatch.delenv(k, raising=False)
    from aios_backend_neuron import discovery, packages

    discovery.clear_cache()
    packages.forget()
    yield
    discovery.clear_cache()
    packages.forget()


def load_fixture(instance: str) -> list[dict]:
    return json.loads((FIXTURES / f"neuron_ls_{instance}.json").read_text())


def write_tool(bindir: Path, body: str) -> Path:
    bindir.mkdir(parents=True, exist_ok=True)
    tool = bindir / "neuron-ls"
    tool.write_text(f"#!{sys.executable}\n{body}")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return tool


@pytest.fixture
def fake_neuron_ls(tmp_path, monkeypatch):
    """``fake_neuron_ls("trn1.32xlarge", mode=...)`` -> path of the stand-in tool.

    modes: ``json-output`` (Neuron <= 2.33: ``--json-output``/``-j``), ``output-format`` (Neuron
    2.34+: only ``--output-format json``, an object with the devices under ``neuron_devices``),
    ``no-driver`` (exit 1 with the logfmt line neuron-ls prints without the driver),
    ``garbage`` (invalid JSON)."""

    def make(
        instance: str = "trn1.2xlarge", mode: str = "json-output", payload: object | None = None
    ) -> Path:
        data = payload if payload is not None else (load_fixture(instance) if instance else [])
        src = tmp_path / "neuron_ls_payload.json"
        src.write_text(json.dumps(data, indent=4))
        body = f"""
import json, sys
args = sys.argv[1:]
mode = {mode!r}
data = json.load(open({str(src)!r}))
if mode == "no-driver":
    sys.stderr.write('time="2026-09-12T02:42:06Z" level=fatal msg="Failed to load MLA system information" '
                     'error="failed to discover Neuron devices"\\n')
    sys.exit(1)
if mode == "garbage":
    print("{{not json"); sys.exit(0)
if mode == "json-output" and args in (["--json-output"], ["-j"]):
    print(json.dumps(data, indent=4)); sys.exit(0)
if mode == "output-format" and args == ["--output-format", "json"]:
    first = data[0] if data else {{}}
    print(json.dumps({{"instance_type": first.get("instance_type"), "instance_id": first.get("instance_id"),
                      "neuron_devices": [{{k: v for k, v in d.items() if k not in ("instance_type", "instance_id")}}
                                         for d in data]}}))
    sys.exit(0)
sys.stderr.write("neuron-ls: unknown flag: " + " ".join(args) + "\\nusage: neuron-ls [options]\\n")
sys.exit(2)
"""
        bindir = tmp_path / "bin"
        tool = write_tool(bindir, body)
        monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
        from aios_backend_neuron import discovery

        discovery.clear_cache()
        return tool

    return make


@pytest.fixture
def no_neuron_ls(tmp_path, monkeypatch):
    """A PATH without neuron-ls (the Python interpreter's directory stays reachable)."""
    if os.access("/opt/aws/neuron/bin/neuron-ls", os.X_OK):
        pytest.skip("a real neuron-ls is installed at /opt/aws/neuron/bin")
    keep = [
        p
        for p in os.environ.get("PATH", "").split(os.pathsep)
        if p and not (Path(p) / "neuron-ls").exists()
    ]
    monkeypatch.setenv("PATH", os.pathsep.join(keep))


def _dist_info(
    site: Path, name: str, version: str, requires: list[str] = (), summary: str = ""
) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if summary:
        lines.append(f"Summary: {summary}")
    lines += [f"Requires-Dist: {r}" for r in requires]
    (d / "METADATA").write_text("\n".join(lines) + "\n\n")
    (d / "RECORD").write_text("")


@pytest.fixture
def neuron_site(tmp_path, monkeypatch):
    """``neuron_site("placeholders")`` or ``neuron_site("xla"|"native", **versions)`` -> site dir."""

    def make(
        kind: str,
        torch_neuronx: str | None = None,
        neuronx_cc: str = "2.27.5334.0+f702b353",
        neuronx_distributed: str | None = "0.16.25997",
    ) -> Path:
        site = tmp_path / f"site-{kind}"
        if kind == "placeholders":
            shutil.copytree(FIXTURES / "pypi_placeholders", site)
        elif kind == "xla":
            _dist_info(
                site,
                "torch-neuronx",
                torch_neuronx or "2.9.0.2.11.19912",
                ["torch==2.9.*", "torch-xla==2.9.*", "libneuronxla==2.2.*", "neuronx-cc>=2.0"],
                "PyTorch Neuron on torch_xla",
            )
            _dist_info(site, "neuronx-cc", neuronx_cc, ["numpy"], "Neuron compiler")
            if neuronx_distributed:
                _dist_info(site, "neuronx-distributed", neuronx_distributed, ["torch-neuronx"])
        elif kind == "native":
            _dist_info(
                site, "torch-neuronx", torch_neuronx or "2.14.3.0", ["torch==2.14.*"], "TorchNeuron"
            )
            _dist_info(site, "neuronx-cc", neuronx_cc, ["numpy"], "Neuron compiler")
        else:
            raise ValueError(kind)
        monkeypatch.setenv("AIOS_TEST_NEURON_SITE", str(site))
        return site

    return make


@pytest.fixture
def config():
    """``config("neuron.tp_degree=8", precision="bf16-mixed")`` -> resolved AiosConfig."""
    from aios.config.schema import resolve

    def make(*overrides: str, **flags):
        return resolve(
            overrides=["backend=neuron", *overrides], flags=flags, environ={}, check_backend=False
        )

    return make
