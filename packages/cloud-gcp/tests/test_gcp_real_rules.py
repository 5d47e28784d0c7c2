"""Rules of the real Cloud TPU API and TPU VM images, enforced by the local TPU service
(:mod:`aios_cloud_gcp.testing`, each rule with its documentation link there): multi-host slices
cannot be stopped, TPU7x is not served by the TPU API, the real zone table, an absolute
valid-until across failover, and TorchTPU's Python on the runtime images."""

from __future__ import annotations

import datetime as dt

import pytest
from aios_cloud.failover import create_with_failover
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError
from aios_cloud_gcp.provider import GcpProvider
from aios_cloud_gcp.settings import GcpSettings
from aios_cloud_gcp.testing import REAL_ZONES, FakeTpuService, SetupFailed, check_setup


class _Cfg:
    def __init__(self, settings: GcpSettings) -> None:
        self.settings = settings

    def section(self, name: str):
        return self.settings if name == "gcp" else None


def provider(svc, **kw) -> GcpProvider:
    s = dict(project="aios-test", endpoint=svc.url, credentials="anonymous", poll_interval=0.02)
    s.update(kw)
    return GcpProvider(_Cfg(GcpSettings(**s)))


def req(p: GcpProvider, **kw) -> ClusterRequest:
    base = dict(
        name="c1", accelerator="v5litepod-16", labels={"aios-cluster": kw.get("name", "c1")}
    )
    base.update(kw)
    return p.validate(ClusterRequest(**base))


def test_multi_host_slice_is_never_stopped_only_single_host(bare_tpu):
    from google.api_core import exceptions as gex

    p = provider(bare_tpu)
    multi = req(p, zone="us-west4-a")
    assert not p.can_stop(False, multi.accelerator)
    p.create(multi)
    with pytest.raises(CloudError, match="multi-host") as ei:
        p.stop("c1", multi.zone)
    assert "aios down c1" in ei.value.fix
    assert bare_tpu.count("POST", ":stop") == 0  # refused before the API call
    # the service refuses it too, as Cloud TPU does
    with pytest.raises(gex.BadRequest, match="only available with single TPU nodes"):
        p.client().stop_node(request={"name": p._node_name("c1", multi.zone)}).result()
    p.delete("c1", multi.zone)
    single = req(p, name="c2", accelerator="v5litepod-8", zone="us-west4-a")
    assert p.can_stop(False, single.accelerator)
    p.create(single)
    p.stop("c2", single.zone)
    assert bare_tpu.node("c2").body["state"] == "STOPPED"
    p.delete("c2", single.zone)


def test_tpu7x_is_not_requested_from_the_tpu_api(bare_tpu):
    from google.api_core import exceptions as gex

    p = provider(bare_tpu)
    with pytest.raises(CloudError) as ei:
        req(p, accelerator="tpu7x-8")
    assert "GKE" in str(ei.value) and "--cloud k8s" in ei.value.fix
    assert not bare_tpu.received
    # the service refuses it, as the frozen TPU API does
    from google.cloud import tpu_v2

    with pytest.raises(gex.BadRequest, match="not supported by the Cloud TPU API"):
        p.client().create_node(
            parent="projects/aios-test/locations/us-central1-c",
            node_id="x",
            node=tpu_v2.Node(accelerator_type="tpu7x-8", runtime_version="x"),
        ).result()


@pytest.mark.parametrize(
    "acc,zone",
    [
        ("v2-32", "us-central1-a"),
        ("v6e-8", "us-east5-c"),
        ("v6e-8", "us-west1-c"),
        ("v5p-8", "us-east5-b"),
    ],
)
def test_zone_table_takes_the_real_zones(acc, zone):
    with FakeTpuService(project="aios-test", offered=REAL_ZONES) as svc:
        p = provider(svc)
        r = req(p, accelerator=acc, zone=zone)
        assert r.zone == zone
        p.create(r)
        p.delete("c1", zone)


def test_relative_valid_until_is_one_absolute_time_across_failover(bare_tpu, monkeypatch):
    p = provider(bare_tpu, zones={"v5e": ["us-west4-a", "us-central1-a"]})
    r = req(p, queued=True, valid_until="+6h")
    until = dt.datetime.fromisoformat(r.valid_until.replace("Z", "+00:00"))
    assert abs((until - dt.datetime.now(dt.timezone.utc)).total_seconds() - 6 * 3600) < 60
    bare_tpu.inject_quota("us-west4-a")
    res = create_with_failover(p, r, ["us-west4-a", "us-central1-a"], sleep=lambda s: None)
    assert res.zone == "us-central1-a"
    bodies = [b for name, b in bare_tpu.received if "/queuedResources/" in name]
    assert len(bodies) == 2
    assert {b["queueingPolicy"]["validUntilTime"] for b in bodies} == {r.valid_until}
    p.delete("c1", res.zone)


def test_torch_tpu_goes_into_a_python_that_can_take_it(bare_tpu):
    p = provider(bare_tpu)
    for acc in ("v6e-8", "v5litepod-16", "v4-16"):
        runtime = p.entry(acc).runtime
        lines = p.setup_commands(acc, ["numpy"], backend="tpu")
        python = p.python(acc, backend="tpu")
        check_setup(runtime, lines, python)  # raises where the image would fail
        assert not python.startswith(("python3", "/usr/bin"))
    # the rule itself: the image's python3 is 3.10, torch_tpu has no wheel for it
    with pytest.raises(SetupFailed, match="from versions: none"):
        check_setup("v2-alpha-tpuv6e", ["python3 -m pip install torch_tpu==0.2.0"], "python3")
    # torch_xla (backend xla) stays on the image's python3
    assert p.python("v6e-8") == "python3"


def test_autostop_checks_the_vm_service_account_before_anything_is_created(bare_tpu):
    p = provider(bare_tpu)
    r = req(p, accelerator="v5litepod-8", zone="us-west4-a")
    # the default compute service account keeps its default Editor role here: fine
    assert p.prepare_autostop(r, "stop") == r
    # an organisation stripped it (iam.automaticIamGrantsForDefaultServiceAccounts)
    bare_tpu.iam_bindings = {
        "roles/tpu.viewer": {f"serviceAccount:{bare_tpu.default_service_account}"}
    }
    with pytest.raises(CloudError) as ei:
        p.prepare_autostop(r, "down")
    msg = str(ei.value)
    assert "tpu.nodes.delete" in msg and bare_tpu.default_service_account in msg
    assert "add-iam-policy-binding aios-test" in ei.value.fix and "roles/tpu.admin" in ei.value.fix
    assert not bare_tpu.received  # nothing created
    # `aios autostop NAME MIN` later: the same check, before the agent is installed
    with pytest.raises(CloudError, match="tpu.nodes.stop"):
        p.grant_autostop("later", "us-west4-a", "stop")
    # a named service account with the TPU admin role passes
    sa = "trainer@aios-test.iam.gserviceaccount.com"
    bare_tpu.iam_bindings["roles/tpu.admin"] = {f"serviceAccount:{sa}"}
    assert provider(bare_tpu, service_account=sa).prepare_autostop(r, "down") == r


def test_the_agent_acts_as_the_vms_service_account(bare_tpu):
    """The stand-in's rule: a call from a node's VM passes only with its account's rights."""
    p = provider(bare_tpu)
    r = req(p, accelerator="v5litepod-8", zone="us-west4-a")
    p.create(r)
    vm = bare_tpu.node("c1").body["networkEndpoints"][0]["accessConfig"]["externalIp"]
    path = f"/v2/projects/aios-test/locations/{r.zone}/nodes/c1"
    bare_tpu.iam_bindings = {}
    bare_tpu._caller.ip = vm
    from aios_cloud_gcp.testing import ApiError

    with pytest.raises(ApiError, match="tpu.nodes.stop"):
        bare_tpu.dispatch("POST", path + ":stop", {}, {})
    bare_tpu.iam_bindings = {
        "roles/tpu.admin": {f"serviceAccount:{bare_tpu.default_service_account}"}
    }
    assert bare_tpu.dispatch("POST", path + ":stop", {}, {})[0] == 200
    bare_tpu._caller.ip = None
    p.delete("c1", r.zone)
