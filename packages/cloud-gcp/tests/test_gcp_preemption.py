"""The GCE preemption watcher against a local metadata server (``GCE_METADATA_HOST``)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aios_cloud_gcp.preemption import GcePreemptionWatcher


@pytest.fixture
def metadata():
    state = {"preempted": "FALSE", "headers": [], "paths": []}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            state["headers"].append(self.headers.get("Metadata-Flavor"))
            state["paths"].append(self.path)
            if not self.path.startswith("/computeMetadata/v1/instance/preempted"):
                self.send_response(404)
                self.end_headers()
                return
            if "wait_for_change=true" in self.path:
                changed.wait(5)
            body = state["preempted"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    changed = threading.Event()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    state["host"] = f"127.0.0.1:{srv.server_address[1]}"
    state["changed"] = changed
    yield state
    changed.set()
    srv.shutdown()


def test_gcp_watcher_notifies_once_on_preemption(metadata):
    got: list[str] = []
    fired = threading.Event()
    w = GcePreemptionWatcher(host=metadata["host"], timeout=5)
    w.start(lambda reason: (got.append(reason), fired.set()))
    assert not fired.wait(0.5)  # FALSE: nothing yet
    metadata["preempted"] = "TRUE"
    metadata["changed"].set()
    assert fired.wait(10)
    w.stop()
    assert got == ["GCE preemption notice (metadata instance/preempted=TRUE)"]
    assert set(metadata["headers"]) == {"Google"} and any(
        "wait_for_change=true" in p for p in metadata["paths"]
    )


def test_gcp_watcher_registered_only_on_gce(metadata, monkeypatch):
    from aios_cloud_gcp import plugin, preemption

    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
    monkeypatch.setattr(preemption, "DMI", preemption.Path("/nonexistent"))
    assert plugin.aios_preemption_watchers(config=None) is None
    monkeypatch.setenv("GCE_METADATA_HOST", metadata["host"])
    ws = plugin.aios_preemption_watchers(config=None)
    assert len(ws) == 1 and ws[0].host == metadata["host"]
