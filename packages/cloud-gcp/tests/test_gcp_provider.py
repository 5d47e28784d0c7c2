"""GcpProvider with the real google-cloud-tpu REST client against the local Cloud TPU service."""

from __future__ import annotations

import time

import pytest
from aios_cloud.failover import create_with_failover
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CapacityError, CloudError, CredentialsError, QuotaError
from aios_cloud_gcp.provider import GcpProvider, TransientCloudError
from aios_cloud_gcp.settings import GcpSettings


class _Cfg:
    def __init__(self, settings: GcpSettings) -> None:
        self.settings = settings

    def section(self, name: str):
        return self.settings if name == "gcp" else None


def provider(svc, **kw) -> GcpProvider:
    s = dict(
        project="aios-test",
        endpoint=svc.url,
        credentials="anonymous",
        poll_interval=0.02,
        zones={"v4": ["us-central2-b", "us-central2-c"], "v5e": ["us-west4-a", "us-central1-a"]},
    )
    s.update(kw)
    return GcpProvider(_Cfg(GcpSettings(**s)))


def req(p: GcpProvider, **kw) -> ClusterRequest:
    base = dict(name="c1", accelerator="v4-16", labels={"aios-cluster": kw.get("name", "c1")})
    base.update(kw)
    return p.validate(ClusterRequest(**base))


@pytest.mark.parametrize(
    "acc,runtime,hosts",
    [
        ("v6e-4", "v2-alpha-tpuv6e", 1),
        ("v5litepod-8", "v2-alpha-tpuv5-lite", 1),
        ("v5p-8", "v2-alpha-tpuv5", 1),
        ("v4-16", "tpu-ubuntu2204-base", 2),
        ("v5litepod-16", "v2-alpha-tpuv5-lite", 4),
    ],
)
def test_gcp_runtime_version_per_generation_reaches_the_api(bare_tpu, acc, runtime, hosts):
    p = provider(bare_tpu)
    r = req(p, accelerator=acc, zone=None)
    info = p.create(r)
    body = bare_tpu.node("c1").body
    assert body["runtimeVersion"] == runtime and body["acceleratorType"] == acc
    assert info.ready and len(info.hosts) == hosts and info.hosts[0].ip.startswith("203.0.113.")
    assert [h.worker_id for h in info.hosts] == list(range(hosts))
    p.delete("c1", r.zone)
    assert bare_tpu.nodes == {}


def test_gcp_node_lifecycle_spot_labels_and_list(bare_tpu):
    p = provider(bare_tpu)
    r = req(p, spot=True, ssh_public_key="ssh-ed25519 AAAAC3 test", ssh_user="aios")
    info = p.create(r)
    body = bare_tpu.node("c1").body
    assert body["schedulingConfig"]["spot"] is True and info.spot
    assert body["metadata"]["ssh-keys"] == "aios:ssh-ed25519 AAAAC3 test"
    assert body["labels"]["aios-cluster"] == "c1"
    assert [c.name for c in p.list()] == ["c1"]
    with pytest.raises(CloudError, match="cannot stop c1: spot capacity cannot be stopped"):
        p.stop("c1", r.zone)
    assert p.describe("c1", r.zone).state == "READY"
    bare_tpu.preempt("c1")
    assert p.describe("c1", r.zone).preempted
    bare_tpu.set_health("c1", "UNHEALTHY_TENSORFLOW")
    d = p.describe("c1", r.zone)
    assert d.unhealthy and d.health_detail == "UNHEALTHY_TENSORFLOW"
    p.delete("c1", r.zone)
    p.delete("c1", r.zone)  # idempotent
    assert p.describe("c1", r.zone) is None


def test_gcp_errors_are_classified_for_failover(bare_tpu):
    p = provider(bare_tpu)
    bare_tpu.inject_stockout("us-central2-b")
    with pytest.raises(CapacityError) as e:
        p.create(req(p, zone="us-central2-b"))
    assert p.classify_error(e.value) == "stockout" and "no more capacity" in str(e.value)
    p.delete("c1", "us-central2-b")
    bare_tpu.inject_quota("us-central2-b")
    with pytest.raises(QuotaError) as e:
        p.create(req(p, zone="us-central2-b"))
    assert p.classify_error(e.value) == "quota"
    bare_tpu.inject_unavailable(1)
    with pytest.raises(TransientCloudError) as e:
        p.create(req(p, zone="us-central2-b"))
    assert p.classify_error(e.value) == "transient"
    assert bare_tpu.nodes == {}


def test_gcp_failover_moves_zone_and_cleans_up(bare_tpu):
    p = provider(bare_tpu)
    bare_tpu.inject_stockout("us-central2-b")
    logs: list[str] = []
    sleeps: list[float] = []
    res = create_with_failover(
        p, req(p), ["us-central2-b", "us-central2-c"], log=logs.append, sleep=sleeps.append
    )
    assert res.zone == "us-central2-c" and [a.kind for a in res.attempts] == ["stockout"]
    assert len(sleeps) == 1 and sleeps[0] > 0  # backoff before the next zone
    # the stocked-out zone's leftover node was deleted; only the good one exists
    assert [n.zone for n in bare_tpu.nodes.values()] == ["us-central2-c"]
    p.delete("c1", "us-central2-c")
    # a transient error retries the same zone
    bare_tpu.inject_unavailable(1)
    res = create_with_failover(p, req(p), ["us-central2-b", "us-central2-c"], sleep=lambda s: None)
    assert res.zone == "us-central2-b" and [a.kind for a in res.attempts] == ["transient"]
    p.delete("c1", "us-central2-b")
    # everywhere out of quota: a QuotaError naming the zones, nothing left behind
    bare_tpu.inject_quota("us-central2-b")
    bare_tpu.inject_quota("us-central2-c")
    with pytest.raises(QuotaError) as e:
        create_with_failover(p, req(p), ["us-central2-b", "us-central2-c"], sleep=lambda s: None)
    assert "us-central2-b (quota), us-central2-c (quota)" in str(e.value)
    assert bare_tpu.nodes == {}


def test_gcp_queued_resource_waits_for_capacity_within_its_window(bare_tpu):
    p = provider(bare_tpu)
    bare_tpu.inject_stockout("us-west4-a", 3)  # the queue waits these out instead of failing
    r = req(
        p,
        name="q1",
        accelerator="v5litepod-8",
        queued=True,
        spot=True,
        valid_until="+1h",
        valid_after="+0s",
    )
    info = p.create(r)
    qr = bare_tpu.queued["projects/aios-test/locations/us-west4-a/queuedResources/q1"]["body"]
    # after and until together are one interval (they share a oneof in the API)
    interval = qr["queueingPolicy"]["validInterval"]
    assert set(interval) == {"startTime", "endTime"} and "spot" in qr
    assert info.ready and bare_tpu.node("q1").body["queuedResource"].endswith("/queuedResources/q1")
    p.delete("q1", r.zone)
    assert bare_tpu.nodes == {} and bare_tpu.queued == {}
    # the window closes before capacity shows up
    bare_tpu.inject_stockout("us-west4-a", 10_000)
    r = req(p, name="q2", accelerator="v5litepod-8", queued=True, valid_until="+1s")
    t = time.monotonic()
    with pytest.raises(CapacityError, match="validUntil passed"):
        p.create(r)
    assert time.monotonic() - t < 30
    p.delete("q2", r.zone)
    assert bare_tpu.queued == {}


def test_gcp_bad_requests_are_one_line_errors(bare_tpu, monkeypatch):
    p = provider(bare_tpu)
    with pytest.raises(CloudError, match="unknown accelerator 'v9-8'"):
        p.validate(ClusterRequest(name="x", accelerator="v9-8"))
    with pytest.raises(CloudError, match="zone 'europe-west9-z' does not offer v4-16"):
        p.validate(ClusterRequest(name="x", accelerator="v4-16", zone="europe-west9-z"))
    with pytest.raises(CloudError, match="multislice"):
        p.validate(ClusterRequest(name="x", accelerator="v4-16", nodes=2))
    with pytest.raises(CloudError, match="valid-until"):
        p.validate(
            ClusterRequest(name="x", accelerator="v4-16", queued=True, valid_until="tomorrow")
        )
    for var in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no gcloud to ask
    noproj = provider(bare_tpu, project=None)
    with pytest.raises(CloudError, match="no GCP project is set"):
        noproj.validate(ClusterRequest(name="x", accelerator="v4-16"))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/key.json")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    nocreds = provider(bare_tpu, credentials="auto")
    with pytest.raises(CredentialsError, match="no Google Cloud credentials found") as e:
        nocreds.describe_credentials()
    assert "\n" not in str(e.value)
    assert bare_tpu.calls == []


def test_gcp_dry_run_rendering(bare_tpu):
    p = provider(bare_tpu)
    r = req(p, spot=True)
    line = p.render_create(r)[0].shell()
    assert line.startswith(
        "gcloud compute tpus tpu-vm create c1 --project=aios-test --zone=us-central2-b "
        "--accelerator-type=v4-16 --version=tpu-ubuntu2204-base --spot"
    )
    q = req(p, queued=True, valid_until="+6h")
    assert (
        "queued-resources create c1 --node-id=c1" in p.render_create(q)[0].shell()
        and f"--valid-until-time={q.valid_until}" in p.render_create(q)[0].shell()
    )
    assert [c.shell().split()[3:5] for c in p.render("delete", "c1", "us-central2-b")] == [
        ["queued-resources", "delete"],
        ["tpu-vm", "delete"],
    ]
    assert bare_tpu.calls == []
