"""Discovery seams: fake sysfs, a local metadata server (through GCE_METADATA_HOST), GKE env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from aios_backend_xla.components import device_report
from aios_backend_xla.discovery import (
    MetadataSource,
    SysfsSource,
    discover,
    parse_tpu_env,
    parse_worker_endpoints,
)

GOOGLE = "0x1ae0"


def test_sysfs_counts_only_google_tpu_devices(fake_sysfs):
    root = fake_sysfs(
        [(GOOGLE, "0x005e")] * 4 + [("0x8086", "0x1237"), (GOOGLE, "0x1234"), ("0x10de", "0x005e")]
    )
    assert SysfsSource(root).chips() == ["0x005e"] * 4


def test_sysfs_missing_root_is_empty(tmp_path):
    assert SysfsSource(tmp_path / "nope").chips() == []


def test_metadata_source_reads_attributes_with_flavor_header(metadata_server, tpu_attrs):
    srv = metadata_server(tpu_attrs("v4-16", worker=1))
    md = MetadataSource(host=srv.host)
    attrs = md.attributes()
    assert attrs["accelerator-type"] == "v4-16"
    assert attrs["agent-worker-number"] == "1"
    assert md.get("no-such-key") is None
    assert all(p.startswith("/computeMetadata/v1/instance/attributes/") for p in srv.requests)


def test_metadata_unreachable_is_fast_and_recorded(clean_env, free_port):
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    facts = discover(
        sysfs=SysfsSource("/nonexistent"), environ={"GCE_METADATA_HOST": f"127.0.0.1:{port}"}
    )
    assert time.monotonic() - t0 < 3
    assert not facts.present
    assert facts.problems and "unreachable" in facts.problems[0]


def test_parse_tpu_env_and_endpoints():
    env = parse_tpu_env(
        "ACCELERATOR_TYPE: 'v4-16'\nWORKER_ID: '1'\n# comment: x\nZONE: \"us-central2-b\"\n"
    )
    assert env == {"ACCELERATOR_TYPE": "v4-16", "WORKER_ID": "1", "ZONE": "us-central2-b"}
    assert parse_worker_endpoints("w-0:u0:10.0.0.2,w-1:u1:10.0.0.3") == ["10.0.0.2", "10.0.0.3"]


def test_tpu_vm_pod_worker_from_sysfs_and_metadata(
    fake_sysfs, metadata_server, clean_env, tpu_attrs
):
    root = fake_sysfs([(GOOGLE, "0x005e")] * 4)
    srv = metadata_server(tpu_attrs("v4-16", worker=1))
    facts = discover(sysfs=SysfsSource(root), environ={"GCE_METADATA_HOST": srv.host})
    assert facts.present and facts.pci_chips == 4
    assert facts.accelerator_type == "v4-16" and facts.worker_id == 1
    assert facts.worker_addresses == ["10.0.0.2", "10.0.0.3"]
    assert facts.sources == ["sysfs", "metadata"]
    rep = device_report(facts, installed=True)
    assert rep.available and rep.count == 4 and rep.kind == "TPU v4 chip"
    assert (
        rep.topology["hosts"] == 2 and rep.topology["chips"] == 8 and rep.topology["worker_id"] == 1
    )
    assert rep.devices[0].memory_bytes == 32 * 2**30


def test_metadata_not_asked_off_gce(clean_env, metadata_server, tpu_attrs):
    srv = metadata_server(tpu_attrs())
    facts = discover(sysfs=SysfsSource("/nonexistent"), environ={}, dmi_path="/nonexistent")
    assert not facts.present and srv.requests == []


def test_gke_env_without_metadata(clean_env, metadata_server, tpu_attrs):
    srv = metadata_server(tpu_attrs("v4-8"))
    env = {
        "TPU_ACCELERATOR_TYPE": "v5litepod-16",
        "TPU_WORKER_ID": "2",
        "TPU_WORKER_HOSTNAMES": "h0,h1,h2,h3",
        "TPU_SKIP_MDS_QUERY": "true",
        "GCE_METADATA_HOST": srv.host,
    }
    facts = discover(sysfs=SysfsSource("/nonexistent"), environ=env)
    assert facts.present and facts.accelerator_type == "v5litepod-16" and facts.worker_id == 2
    assert facts.worker_addresses == ["h0", "h1", "h2", "h3"]
    assert srv.requests == []  # TPU_SKIP_MDS_QUERY honoured
    assert facts.topology().hosts == 4


def test_malformed_metadata_type_is_a_note_not_a_crash(fake_sysfs, metadata_server, clean_env):
    root = fake_sysfs([(GOOGLE, "0x0063")] * 8)
    srv = metadata_server({"accelerator-type": "v5litepod-banana"})
    facts = discover(sysfs=SysfsSource(root), environ={"GCE_METADATA_HOST": srv.host})
    rep = device_report(facts, installed=True)
    assert rep.count == 8 and any(
        "invalid TPU accelerator type 'v5litepod-banana'" in n for n in rep.notes
    )


def test_no_tpu_report_names_the_opt_in(clean_env):
    facts = discover(sysfs=SysfsSource("/nonexistent"), environ={})
    rep = device_report(facts, installed=True)
    assert not rep.available
    assert (
        "no TPU was found" in rep.reason
        and "xla.allow_cpu=true" in rep.reason
        and "AIOS_XLA__ALLOW_CPU=1" in rep.reason
    )


def test_opt_in_report_is_xla_cpu(clean_env):
    clean_env.setenv("AIOS_XLA__ALLOW_CPU", "1")
    facts = discover(sysfs=SysfsSource("/nonexistent"), environ={})
    rep = device_report(facts, installed=True)
    assert rep.available and rep.kind == "XLA:CPU (opt-in)"


def _cli(args, env, timeout=120):
    code = (
        "import sys, json\n"
        "from aios.cli.main import cli\n"
        f"try:\n    cli({args!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "print('MODULES', json.dumps(sorted(m for m in ('torch', 'torch_xla') if m in sys.modules)))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


def test_aios_devices_on_a_fake_tpu_vm_imports_no_torch(fake_sysfs, metadata_server, clean_env):
    root = fake_sysfs([(GOOGLE, "0x006f")] * 4)
    srv = metadata_server(
        {
            "accelerator-type": "v6e-4",
            "agent-worker-number": "0",
            "worker-network-endpoints": "w-0:u:10.1.0.2",
        }
    )
    env = {k: v for k, v in os.environ.items()}
    env.update(AIOS_TEST_SYSFS_PCI=str(root), GCE_METADATA_HOST=srv.host)
    out = _cli(["devices", "--json", "--backend", "xla"], env)
    assert out.returncode == 0, out.stderr
    text, _, mods = out.stdout.rpartition("MODULES ")
    assert json.loads(mods) == []
    rep = json.loads(text)[0]
    assert rep["available"] is (
        "torch_xla" in sys.modules
        or __import__("importlib.util").util.find_spec("torch_xla") is not None
    )
    assert rep["kind"] == "TPU v6e chip" and rep["count"] == 4
    assert (
        rep["topology"]["accelerator_type"] == "v6e-4"
        and rep["topology"]["peak_bf16_tflops"] == 3672.0
    )


def test_aios_plugins_imports_no_torch(clean_env):
    out = _cli(["plugins", "--json"], dict(os.environ))
    assert out.returncode == 0, out.stderr
    text, _, mods = out.stdout.rpartition("MODULES ")
    assert json.loads(mods) == []
    names = [p["name"] for p in json.loads(text)["plugins"]]
    assert "aios-backend-xla" in names


def test_plugin_module_imports_nothing_heavy():
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, aios_backend_xla.plugin, aios_backend_xla.topology, "
            "aios_backend_xla.discovery, aios_backend_xla.launch;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch','torch_xla','numpy','requests')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
