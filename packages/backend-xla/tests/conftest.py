"""Fixtures for aios-backend-xla tests: a fake sysfs PCI tree, a local HTTP server standing in
for the GCE metadata server (reached through GCE_METADATA_HOST, the seam the real client uses),
and the `xla` marker's skip when torch_xla is absent."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
HERE = Path(__file__).parent


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="torch_xla not installed")
    for item in items:
        if "xla" in item.keywords and not HAS_TORCH_XLA:
            item.add_marker(skip)


def make_sysfs(root: Path, devices: list[tuple[str, str]]) -> Path:
    """Create ``root/<bdf>/{vendor,device}`` for each (vendor, device) pair."""
    root.mkdir(parents=True, exist_ok=True)
    for i, (vendor, device) in enumerate(devices):
        d = root / f"0000:00:{i + 4:02x}.0"
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
    return root


@pytest.fixture
def fake_sysfs(tmp_path):
    def build(devices):
        return make_sysfs(tmp_path / "pci", devices)

    return build


class MetadataServer:
    """A GCE metadata server fake on 127.0.0.1: answers /computeMetadata/v1/instance/attributes/KEY
    from ``attributes`` and insists on the Metadata-Flavor header like the real one."""

    def __init__(self, attributes: dict[str, str]) -> None:
        self.attributes = dict(attributes)
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_response(403)
                    self.end_headers()
                    return
                prefix = "/computeMetadata/v1/instance/attributes/"
                key = self.path[len(prefix) :] if self.path.startswith(prefix) else None
                if key is None or key not in server.attributes:
                    self.send_response(404)
                    self.end_headers()
                    return
                body = server.attributes[key].encode()
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def tpu_vm_attributes(
    acc: str = "v4-16", worker: int = 0, ips: tuple[str, ...] = ("10.0.0.2", "10.0.0.3")
) -> dict[str, str]:
    """Attributes as a TPU VM's metadata server serves them (recorded shapes)."""
    tpu_env = "\n".join(
        [
            f"ACCELERATOR_TYPE: '{acc}'",
            "CHIPS_PER_HOST_BOUNDS: '2,2,1'",
            f"HOST_BOUNDS: '1,1,{len(ips)}'",
            f"WORKER_ID: '{worker}'",
            "ZONE: 'us-central2-b'",
            "TYPE: 'V4'",
        ]
    )
    endpoints = ",".join(f"t1v-n-abc-w-{i}:uid{i}:{ip}" for i, ip in enumerate(ips))
    return {
        "accelerator-type": acc,
        "tpu-env": tpu_env,
        "agent-worker-number": str(worker),
        "worker-network-endpoints": endpoints,
    }


@pytest.fixture
def metadata_server():
    servers: list[MetadataServer] = []

    def start(attributes):
        s = MetadataServer(attributes)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


@pytest.fixture
def clean_env(monkeypatch):
    """No TPU hints from the real environment leak into a test."""
    for k in list(os.environ):
        if k.startswith(("TPU_", "AIOS_", "GCE_METADATA", "PJRT_", "XLA_", "CPU_NUM_DEVICES")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AIOS_TEST_DMI_PRODUCT", "/nonexistent")
    from aios.plugins.registry import reset_registry

    reset_registry()
    yield monkeypatch
    reset_registry()


def venv_bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@pytest.fixture
def tpu_attrs():
    """``tpu_attrs(acc, worker, ips)``: recorded TPU VM metadata attributes."""
    return tpu_vm_attributes
