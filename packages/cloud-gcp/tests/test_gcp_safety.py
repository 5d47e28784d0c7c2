"""Issue 15 on GCP: zone failover on the errors the real Cloud TPU API gives, the printed gcloud
line equal to the request sent, spot and maintenance rules, queued-resource waits, Ctrl-C
during a create, and finding clusters by label when the local record is gone. The real
google-cloud-tpu client talks to the local Cloud TPU service throughout."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from aios_cloud.failover import create_with_failover, zone_order
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.provider.errors import CloudError, NotOfferedError
from aios_cloud.provider.states import MAINTENANCE
from aios_cloud_gcp import catalog
from aios_cloud_gcp.provider import GcpProvider
from aios_cloud_gcp.settings import GcpSettings
from aios_cloud_gcp.testing import FakeTpuService

V6E = ["us-east5-b", "us-central2-b", "us-east1-d", "us-central1-b", "europe-west4-a"]


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
        zones={"v6e": V6E, "v5e": ["us-west4-a", "us-central1-a"]},
    )
    s.update(kw)
    return GcpProvider(_Cfg(GcpSettings(**s)))


def req(p: GcpProvider, **kw) -> ClusterRequest:
    base = dict(name="c1", accelerator="v6e-8", labels={"aios-cluster": kw.get("name", "c1")})
    base.update(kw)
    return p.validate(ClusterRequest(**base))


def test_v6e_zone_table_lists_only_zones_that_offer_v6e():
    zones = catalog.entry_for("v6e-8").zones
    assert "us-central2-b" not in zones  # v4 only
    assert {"us-east5-b", "us-east1-d", "us-central1-b", "europe-west4-a"} <= set(zones)


def test_failover_moves_past_every_zone_error_skypilot_fails_over_on():
    offered = {z: {"v6e"} for z in V6E if z != "us-central2-b"}
    with FakeTpuService(project="aios-test", offered=offered) as svc:
        p = provider(svc)
        svc.inject_stockout("us-east5-b")
        svc.inject_create_error(
            "us-east1-d", 3, "The TPU node was PREEMPTED during creation. Retry the request."
        )
        svc.inject_create_error(
            "us-central1-b",
            9,
            "Insufficient reserved capacity. Contact customer support to increase your reservation.",
        )
        res = create_with_failover(p, req(p), V6E, sleep=lambda s: None)
        assert res.zone == "europe-west4-a"
        assert [(a.zone, a.kind) for a in res.attempts] == [
            ("us-east5-b", "stockout"),
            ("us-central2-b", "unavailable"),
            ("us-east1-d", "stockout"),
            ("us-central1-b", "stockout"),
        ]
        assert [n.zone for n in svc.nodes.values()] == [
            "europe-west4-a"
        ]  # every failed zone cleaned up
        p.delete("c1", "europe-west4-a")
        # a type no zone offers: one line saying so, nothing left behind
        with pytest.raises(NotOfferedError, match="no zone tried offers v6e-8"):
            create_with_failover(p, req(p), ["us-central2-b"], sleep=lambda s: None)
        assert svc.nodes == {}


def _flags(line: str) -> dict[str, str]:
    out = {}
    for tok in shlex.split(line.split("  # ")[0]):
        if tok.startswith("--"):
            k, _, v = tok[2:].partition("=")
            out[k] = v
    return out


def _labels(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split(",")) if text else {}


@pytest.mark.parametrize("queued", [False, True])
def test_printed_gcloud_command_is_what_is_sent(queued):
    """The dry-run line and the API request come from one plan: every flag printed matches the
    body the service received, including network, subnetwork, service account, labels, ssh
    keys and internal IPs (queued resources too)."""
    with FakeTpuService(project="aios-test", queue_delay=0.0) as svc:
        p = provider(
            svc,
            network="vpc-a",
            subnetwork="sub-a",
            service_account="tpu@aios-test.iam.gserviceaccount.com",
            use_internal_ip=True,
        )
        r = req(
            p,
            accelerator="v5litepod-8",
            zone="us-west4-a",
            spot=True,
            queued=queued,
            valid_until="+2h" if queued else None,
            ssh_user="aios",
            ssh_public_key="ssh-ed25519 AAAAC3Nza test@aios",
            labels={"aios-cluster": "c1", "team": "ml"},
        )
        printed = p.render_create(r)[0].shell()
        p.create(r)
        path, body = svc.received[-1]
        node = body["tpu"]["nodeSpec"][0]["node"] if queued else body
        f = _flags(printed)
        assert f["accelerator-type"] == node["acceleratorType"]
        assert f["runtime-version" if queued else "version"] == node["runtimeVersion"]
        assert _labels(f["labels"]) == node["labels"] == {"aios-cluster": "c1", "team": "ml"}
        assert (
            f["metadata"]
            == "ssh-keys=" + node["metadata"]["ssh-keys"]
            == "ssh-keys=aios:ssh-ed25519 AAAAC3Nza test@aios"
        )
        assert f["network"] == node["networkConfig"]["network"] == "vpc-a"
        assert f["subnetwork"] == node["networkConfig"]["subnetwork"] == "sub-a"
        assert f["service-account"] == node["serviceAccount"]["email"]
        assert f["scopes"].split(",") == node["serviceAccount"]["scope"]
        assert "internal-ips" in f and not node["networkConfig"].get("enableExternalIps", False)
        assert "spot" in f and (
            "spot" in body if queued else node["schedulingConfig"]["spot"] is True
        )
        assert (
            f["zone"] == "us-west4-a"
            and f["project"] == "aios-test"
            and path.startswith("projects/aios-test/locations/us-west4-a/")
        )
        if queued:
            assert (
                f["valid-until-time"] == body["queueingPolicy"]["validUntilTime"] == r.valid_until
            )
            assert f["node-id"] == "c1"
        # nothing printed that was not sent, nothing sent that was not printed
        known = {
            "project",
            "zone",
            "accelerator-type",
            "version",
            "runtime-version",
            "spot",
            "labels",
            "metadata",
            "network",
            "subnetwork",
            "service-account",
            "scopes",
            "internal-ips",
            "node-id",
            "valid-until-time",
        }
        assert set(f) <= known
        sent_node_keys = set(node) - {"acceleratorType", "runtimeVersion"}
        assert sent_node_keys == {
            "labels",
            "metadata",
            "networkConfig",
            "serviceAccount",
            *(() if queued else ("schedulingConfig",)),
        }
        p.delete("c1", "us-west4-a")


def test_spot_tpus_are_never_stopped_and_maintenance_is_reported():
    with FakeTpuService(project="aios-test") as svc:
        p = provider(svc)
        r = req(p, accelerator="v5litepod-8", zone="us-west4-a", spot=True)
        info = p.create(r)
        with pytest.raises(CloudError, match="cannot stop"):
            p.stop("c1", r.zone)
        with pytest.raises(CloudError, match="cannot be stopped"):
            p.repair(info)  # the watcher recreates instead
        assert svc.count("POST", ":stop") == 0 and svc.node("c1").body["state"] == "READY"
        # the service itself refuses it, as Cloud TPU does
        from google.api_core import exceptions as gex

        with pytest.raises(gex.BadRequest, match="Stopping is not supported for Spot"):
            p.client().stop_node(request={"name": p._node_name("c1", r.zone)}).result()
        svc.maintenance("c1", 0.5)
        d = p.describe("c1", r.zone)
        assert (
            d.health == MAINTENANCE
            and not d.unhealthy
            and d.health_detail == "UNHEALTHY_MAINTENANCE"
        )
        time.sleep(0.6)
        assert p.describe("c1", r.zone).health == "HEALTHY"
        p.delete("c1", r.zone)


def test_queued_resource_waits_until_valid_until_and_survives_transient_errors():
    # create_timeout (for nodes) is far shorter than the queue window: the queue must win
    with FakeTpuService(project="aios-test", queue_delay=1.5) as svc:
        p = provider(svc, create_timeout=0.3, queue_grace=0.0)
        r = req(
            p,
            name="q1",
            accelerator="v5litepod-8",
            zone="us-west4-a",
            queued=True,
            valid_until="+20s",
        )

        def flaky() -> None:  # once the queued resource exists, the API hiccups 3 times
            while not svc.queued:
                time.sleep(0.01)
            svc.inject_unavailable(3)

        t = threading.Thread(target=flaky)
        t.start()
        info = p.create(r)
        t.join()
        assert info.ready and svc.count("DELETE", "queuedResources") == 0
        assert 0 < p.queue_deadline(r) <= 20  # one absolute deadline, counting down
        p.delete("q1", r.zone)
        assert svc.queued == {}


def test_region_picks_and_bounds_the_zones():
    with FakeTpuService(project="aios-test") as svc:
        p = provider(svc)
        r = p.validate(ClusterRequest(name="x", accelerator="v6e-8", region="europe-west4"))
        assert r.zone == "europe-west4-a" and zone_order(p, r, pinned=False) == ["europe-west4-a"]
        with pytest.raises(CloudError, match="zone 'us-east5-b' is not in region europe-west4"):
            p.validate(
                ClusterRequest(
                    name="x", accelerator="v6e-8", region="europe-west4", zone="us-east5-b"
                )
            )
        with pytest.raises(CloudError, match="region asia-south1 offers no v6e-8"):
            p.validate(ClusterRequest(name="x", accelerator="v6e-8", region="asia-south1"))
        assert svc.calls == []


def _project(tmp_path: Path) -> Path:
    work = tmp_path / "proj"
    work.mkdir()
    (work / "train.py").write_text("print('hi')\n")
    return work


def test_ctrl_c_during_a_queued_wait_deletes_the_queued_resource(
    tmp_path, bare_tpu, gcp_env, wait_for
):
    work = _project(tmp_path)
    env = gcp_env(tmp_path, bare_tpu)
    bare_tpu.inject_stockout("us-west4-a", 10**6)  # the queue never gets capacity
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "aios.cli.main",
            "launch",
            "--cloud",
            "gcp",
            "-a",
            "v5litepod-8",
            "--queued",
            "--zone",
            "us-west4-a",
            "--no-failover",
            "--name",
            "qq",
            "--workdir",
            str(work),
            "train.py",
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: bare_tpu.queued, 120, "the queued resource")
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode != 0
    assert bare_tpu.queued == {} and bare_tpu.nodes == {}, err
    assert "deleting what was started" in err
    st = subprocess.run(
        [sys.executable, "-m", "aios.cli.main", "status", "--json"],
        env=env,
        text=True,
        capture_output=True,
        timeout=120,
    )
    assert json.loads(st.stdout) == []


def test_down_and_status_find_a_cluster_whose_record_is_gone(tmp_path, bare_tpu, gcp_env, aios_cli):
    env = gcp_env(tmp_path, bare_tpu)
    p = provider(bare_tpu)
    p.create(
        req(p, name="lost", accelerator="v5litepod-8", zone="us-central1-a")
    )  # no local record
    bare_tpu.inject_stockout("us-west4-a", 10**6)
    from google.cloud import tpu_v2

    plan = p.plan_create(
        req(p, name="waiting", accelerator="v5litepod-8", zone="us-west4-a", queued=True)
    )
    del plan.node["metadata"]
    p.client().create_queued_resource(
        parent=plan.parent,
        queued_resource_id="waiting",
        queued_resource=tpu_v2.QueuedResource.from_json(json.dumps(plan.body)),
    ).result()
    st = aios_cli(env, "status", "--refresh", "--json")
    assert st.returncode == 0, st.stderr
    rows = {r["name"]: r for r in json.loads(st.stdout)}
    assert rows["lost"]["zone"] == "us-central1-a" and "no local record" in rows["lost"]["state"]
    assert rows["waiting"]["state"].startswith("QUEUED")
    for name in ("lost", "waiting"):
        d = aios_cli(env, "down", name)
        assert d.returncode == 0, d.stderr
        assert "no local record; found it on gcp" in d.stderr
    assert bare_tpu.nodes == {} and bare_tpu.queued == {}
    missing = aios_cli(env, "down", "never-was")
    assert (
        missing.returncode == 2
        and "no cluster named 'never-was' here or in the cloud" in missing.stderr
    )


@pytest.mark.parametrize("queued", [False, True])
def test_reservation_reaches_the_api_as_printed(queued):
    with FakeTpuService(project="aios-test", queue_delay=0.0) as svc:
        p = provider(svc)
        r = req(
            p,
            accelerator="v5litepod-8",
            zone="us-west4-a",
            queued=queued,
            extra={"reservation": "team-res"},
        )
        f = _flags(p.render_create(r)[0].shell())
        p.create(r)
        _path, body = svc.received[-1]
        if queued:
            assert (
                body["reservationName"]
                == f["reservation"]
                == "projects/aios-test/locations/us-west4-a/reservations/team-res"
            )
        else:
            assert "reserved" in f and body["schedulingConfig"] == {"reserved": True}
        p.delete("c1", "us-west4-a")
        with pytest.raises(CloudError, match="--spot and --reservation contradict"):
            req(p, accelerator="v5litepod-8", spot=True, extra={"reservation": "team-res"})


def test_os_login_imports_the_key_and_logs_in_as_the_posix_user():
    with FakeTpuService(project="aios-test") as svc:
        p = provider(
            svc, os_login=True, os_login_user="alice@example.com", os_login_endpoint=svc.url
        )
        r = req(
            p,
            accelerator="v5litepod-8",
            zone="us-west4-a",
            ssh_user="aios",
            ssh_public_key="ssh-ed25519 AAAAC3Nza k@aios",
        )
        printed = [c.shell() for c in p.render_create(r)]
        assert printed[0].startswith("gcloud compute os-login ssh-keys add") and svc.calls == []
        r = p.prepare(r)
        assert r.ssh_user == "alice_example_com" and svc.oslogin_keys == {
            "alice@example.com": ["ssh-ed25519 AAAAC3Nza k@aios"]
        }
        p.create(r)
        _path, body = svc.received[-1]
        assert (
            body["metadata"] == {"enable-oslogin": "TRUE"}
            and _flags(printed[1])["metadata"] == "enable-oslogin=TRUE"
        )
        p.delete("c1", "us-west4-a")
        with pytest.raises(CloudError, match="account is unknown"):
            provider(svc, os_login=True, os_login_endpoint=svc.url).prepare(r)


def test_no_aios_package_from_the_registry(tmp_path, bare_tpu, gcp_env, aios_cli):
    from aios_cloud.provider.requirements import registry_aios

    assert all(
        registry_aios(r)
        for r in ("aios", "aios-core[aws]", "AIOS_Core>=0.1", "aios-cloud-gcp==0.1.0", "aios.core")
    )
    assert not any(
        registry_aios(r)
        for r in (
            "aiosqlite",
            "aiohttp",
            "./packages/core",
            "/wheels/aios_core-0.1.0-py3-none-any.whl",
            "aios-core @ file:///src/packages/core",
            "numpy",
        )
    )
    work = _project(tmp_path)
    (work / "requirements.txt").write_text("numpy\naios-core[gcp]\n")
    env = gcp_env(tmp_path, bare_tpu)
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--requirements",
        str(work / "requirements.txt"),
        "--workdir",
        str(work),
        "--dry-run",
        "train.py",
    )
    assert (
        r.returncode == 2
        and "belongs to an unrelated project" in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )
    r = aios_cli(
        env,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--workdir",
        str(work),
        "--dry-run",
        "train.py",
    )
    assert r.returncode == 0, r.stderr
    setup = [ln for ln in r.stdout.splitlines() if "pip install" in ln]
    assert setup and not any(registry_aios(tok) for ln in setup for tok in ln.split()), setup
    bad = gcp_env(tmp_path, bare_tpu, AIOS_GCP__AIOS_REQUIREMENTS='["aios-core[gcp]"]')
    r = aios_cli(
        bad,
        "launch",
        "--cloud",
        "gcp",
        "-a",
        "v4-16",
        "--workdir",
        str(work),
        "--dry-run",
        "train.py",
    )
    assert r.returncode == 2 and "unrelated project" in r.stderr
