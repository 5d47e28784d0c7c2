"""The GCE preemption watcher against a local metadata server (``GCE_METADATA_HOST``)."""

from __future__ import annotations

import threading
import time

import pytest
from aios_cloud_gcp.preemption import GcePreemptionWatcher
from aios_cloud_gcp.testing import FakeMetadataServer


@pytest.fixture
def metadata():
    with FakeMetadataServer() as md:
        yield md


def test_gcp_watcher_notifies_once_on_preemption(metadata):
    got: list[str] = []
    fired = threading.Event()
    w = GcePreemptionWatcher(host=metadata.host, timeout=5)
    w.start(lambda reason: (got.append(reason), fired.set()))
    end = time.monotonic() + 10
    while len(metadata.paths) < 2 and time.monotonic() < end:  # the read, then the long poll
        time.sleep(0.01)
    assert not fired.wait(0.3)  # FALSE: nothing yet
    # the server holds the long poll (wait_for_change) instead of answering in a busy loop
    assert len(metadata.paths) == 2, metadata.paths
    before = time.time()
    deadline = metadata.preempt()
    assert fired.wait(10)
    w.stop()
    (notice,) = got
    assert notice.reason == "GCE preemption notice (metadata instance/preempted=TRUE)"
    # Compute Engine stops the VM 30 s after the notice; a request without Metadata-Flavor:
    # Google would have been refused (403), so the watcher sent it
    assert notice.source == "gce-preemption"
    assert deadline - 0.5 <= notice.deadline <= deadline + (time.time() - before) + 0.5
    assert any("wait_for_change=true" in p for p in metadata.paths)


def test_gcp_watcher_registered_only_on_gce(metadata, monkeypatch):
    from aios_cloud_gcp import plugin, preemption

    monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
    monkeypatch.setattr(preemption, "DMI", preemption.Path("/nonexistent"))
    assert plugin.aios_preemption_watchers(config=None) is None
    monkeypatch.setenv("GCE_METADATA_HOST", metadata.host)
    ws = plugin.aios_preemption_watchers(config=None)
    assert len(ws) == 1 and ws[0].host == metadata.host


def test_tpu_maintenance_is_a_notice_with_the_windows_start_and_the_slice_is_interrupted():
    """Cloud TPU announces host maintenance on the metadata server
    (https://cloud.google.com/tpu/docs/view-maintenance-notifications); the stand-in serves the
    key and, at the window, stops every machine of the slice (a host event interrupts the whole
    slice). The watcher's notice carries the window's start as its deadline."""
    import time

    from aios_cloud_gcp.preemption import TpuMaintenanceWatcher
    from aios_cloud_gcp.testing import FakeMetadataServer, FakeTpuService
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    class Machine:  # a host of the slice; no disk (home) of its own here
        def __init__(self) -> None:
            self.up = True

        def stop(self) -> None:
            self.up = False

    with FakeTpuService(project="aios-test") as svc, FakeMetadataServer() as md:
        client = tpu_v2.TpuClient(
            credentials=AnonymousCredentials(),
            transport="rest",
            client_options=ClientOptions(api_endpoint=svc.url),
        )
        parent = "projects/aios-test/locations/us-west4-a"
        node = {"accelerator_type": "v5litepod-16", "runtime_version": "v2-alpha-tpuv5-lite"}
        client.create_node(request={"parent": parent, "node_id": "m1", "node": node}).result()
        machines = [Machine() for _ in range(4)]
        svc.node("m1").machines = machines
        w = TpuMaintenanceWatcher(host=md.host, interval=0.05)
        assert w.poll_once() is None  # "no notifications have been received yet"
        got: list = []
        fired = threading.Event()
        w.start(lambda n: (got.append(n), fired.set()))
        start = time.time() + 1.0
        t = svc.schedule_maintenance("m1", start, metadata=md)
        assert fired.wait(10)
        w.stop()
        (notice,) = got
        assert notice.source == "tpu-maintenance" and abs(notice.deadline - int(start)) <= 1
        assert all(m.up for m in machines)  # announced ahead: nothing interrupted yet
        t.join(10)
        assert not any(m.up for m in machines)  # the whole slice at the window
        got_node = client.get_node(request={"name": f"{parent}/nodes/m1"})
        assert got_node.health.name == "UNHEALTHY_MAINTENANCE"
        assert md.upcoming["maintenanceStatus"] == "ONGOING"
        svc.node("m1").machines = []  # the test's machines are not the service's to free
