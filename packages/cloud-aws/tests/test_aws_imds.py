"""The spot interruption watcher against the IMDSv2 stand-in, and its path into the runtime's
preemption monitor."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from aios_cloud_aws.imds import ImdsClient, SpotInterruptionWatcher
from aios_cloud_aws.testing.imds import ImdsServer


@pytest.fixture
def imds():
    with ImdsServer() as srv:
        yield srv


def test_imdsv2_requires_a_token(imds):
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(imds.endpoint + "/latest/meta-data/spot/instance-action", timeout=2)
    assert ei.value.code == 401
    c = ImdsClient(imds.endpoint)
    assert c.spot_notice() is None  # 404: no notice
    assert imds.token_puts == 1 and imds.notice_gets == 1


def test_notice_is_parsed_and_token_refreshed_after_revocation(imds):
    c = ImdsClient(imds.endpoint)
    assert c.spot_notice() is None
    imds.revoke_tokens()
    imds.set_notice("terminate", seconds=120)
    notice = c.spot_notice()
    assert notice is not None and notice.action == "terminate"
    assert 100 < notice.seconds_left() <= 120
    assert imds.token_puts == 2  # 401 after revocation -> a new token, then the notice
    assert "EC2 spot interruption notice: terminate at" in notice.reason()


def test_watcher_notifies_once_and_stops(imds):
    got = []
    w = SpotInterruptionWatcher(interval=0.05, base=imds.endpoint)
    w.start(got.append)
    time.sleep(0.3)
    assert got == [] and w.polls >= 3
    imds.set_notice("stop", seconds=120)
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        time.sleep(0.02)
    polls = w.polls
    time.sleep(0.3)
    w.stop()
    assert len(got) == 1 and "stop at" in got[0].reason
    # the notice's deadline is the instance-action's own time (120 s ahead, to the second)
    assert got[0].source == "aws-spot"
    assert abs(got[0].deadline - (time.time() + 120)) < 5
    assert w.polls == polls  # the thread ended after the notice
    assert imds.token_puts == 1  # one token for every poll


def test_watcher_survives_imds_outage():
    errors = []
    w = SpotInterruptionWatcher(interval=0.05, base="http://127.0.0.1:9", on_error=errors.append)
    got = []
    w.start(got.append)
    time.sleep(0.3)
    w.stop()
    assert got == [] and errors and "IMDS spot notice poll failed" in errors[0]


def test_hook_hands_notice_to_the_runtime_preemption_monitor(imds, monkeypatch):
    """aios_preemption_watchers -> PreemptionMonitor.start_watchers -> monitor.requested."""
    from aios.config.schema import resolve
    from aios.plugins.registry import get_registry, reset_registry
    from aios.resilience.notices import PreemptionMonitor

    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.endpoint)
    reset_registry()
    cfg = resolve(
        overrides=["aws.spot_watch=true", "aws.imds_poll_seconds=0.05"],
        environ={},
        check_backend=False,
    )
    results = get_registry().call_all("aios_preemption_watchers", config=cfg)
    watchers = [w for plugin, ws, exc in results if plugin == "aios-cloud-aws" for w in (ws or [])]
    assert [w.name for w in watchers] == ["aws-spot"]
    mon = PreemptionMonitor(signals=())
    mon.start_watchers(watchers)
    try:
        time.sleep(0.2)
        assert not mon.requested
        imds.set_notice("terminate", 120)
        deadline = time.monotonic() + 5
        while not mon.requested and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mon.requested and mon.reason.startswith("EC2 spot interruption notice: terminate")
    finally:
        mon.uninstall()
    off = resolve(overrides=["aws.spot_watch=false"], environ={}, check_backend=False)
    assert all(
        ws is None
        for plugin, ws, exc in get_registry().call_all("aios_preemption_watchers", config=off)
        if plugin == "aios-cloud-aws"
    )


def test_standalone_server_reads_notice_file(tmp_path):
    import subprocess
    import sys

    notice = tmp_path / "notice.json"
    port_file = tmp_path / "port"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aios_cloud_aws.testing.imds",
            "--notice-file",
            str(notice),
            "--port-file",
            str(port_file),
        ]
    )
    try:
        deadline = time.monotonic() + 20
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        c = ImdsClient(f"http://127.0.0.1:{port_file.read_text()}")
        assert c.spot_notice() is None
        from aios_cloud_aws.testing.imds import notice_json

        notice.write_text(notice_json("terminate", 90))
        assert c.spot_notice().action == "terminate"
    finally:
        p.terminate()
        p.wait(timeout=10)
