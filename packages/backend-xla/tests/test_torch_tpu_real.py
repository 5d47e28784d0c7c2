"""The real TorchTPU 0.2.0 (``torch_tpu``, with torch 2.13 and libtpu), exercised short of a device
op: import and device registration on a fixture sysfs (its own PCI scanner, redirected by
``tpu_scripts/tt_harness.py``), aios's launch environment compared field by field with
``torch.tpu.distributed.set_tpu_launch_env``, and the CLI never importing it.

These run in the ``test-tpu`` hatch environment (``torch_tpu`` installed). Elsewhere they skip
(torch_tpu absent). Each TorchTPU run is a process of its own, never this one: a real op without a
TPU aborts. The runs are forked from a ``tt_harness.py --serve`` process shared by the module, which
imports torch and torch_tpu once (before any scan or registration, as a fresh run does), so each
run costs its work, not the imports; one run's registration cannot reach another's."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
from aios.config.schema import resolve
from aios.types import Host, LaunchRequest
from aios_backend_xla import tpu as T
from aios_backend_xla.discovery import SysfsSource, TpuFacts, discover

pytestmark = pytest.mark.skipif(
    not T.torch_tpu_installed(),
    reason="torch_tpu (TorchTPU) is not installed: run in the test-tpu environment",
)

HERE = Path(__file__).parent
HARNESS = HERE / "tpu_scripts" / "tt_harness.py"
DEVICE_IDS = {"v4": "0x005e", "v5p": "0x0062", "v5e": "0x0063", "v6e": "0x006f"}


def tpu_sysfs(root: Path, generation: str, chips: int, other: int = 2) -> tuple[Path, Path]:
    """A sysfs PCI tree as a TPU VM shows it: ``chips`` Google TPU functions bound to VFIO (an
    ``iommu_group`` link per device, a ``/dev/vfio/<group>`` node per group) plus unrelated
    devices. Returns (pci devices dir, vfio dir)."""
    pci, vfio, groups = root / "pci", root / "vfio", root / "iommu_groups"
    for d in (pci, vfio, groups):
        d.mkdir(parents=True, exist_ok=True)
    for i in range(other):
        dev = pci / f"0000:00:{i:02x}.0"
        dev.mkdir()
        (dev / "vendor").write_text("0x8086\n")
        (dev / "device").write_text("0x1237\n")
    for i in range(chips):
        dev = pci / f"0000:00:{i + 4:02x}.0"
        dev.mkdir()
        (dev / "vendor").write_text("0x1ae0\n")
        (dev / "device").write_text(DEVICE_IDS[generation] + "\n")
        (groups / str(10 + i)).mkdir()
        (dev / "iommu_group").symlink_to(groups / str(10 + i))
        (vfio / str(10 + i)).write_text("")
    return pci, vfio


def _load_harness() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("tt_harness", HARNESS)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # its top level imports only the standard library
    return mod


class Harness:
    """``tt_harness.py --serve`` processes for this module: each imports torch and torch_tpu
    once and forks a process per run (one server per environment, the launch variables that
    ``set_tpu_launch_env`` reads when called aside). This process imports neither."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.runtime_vars: frozenset[str] = _load_harness().RUNTIME_VARS
        self.servers: dict[frozenset[tuple[str, str]], tuple[subprocess.Popen[bytes], Path]] = {}

    def _server(self, env: dict[str, str]) -> tuple[frozenset, subprocess.Popen[bytes], Path]:
        key = frozenset((k, v) for k, v in env.items() if k not in self.runtime_vars)
        proc, log = self.servers.get(key) or (None, self.logs / f"server{len(self.servers)}.log")
        if proc is None or proc.poll() is not None:
            with open(log, "wb") as f:
                proc = subprocess.Popen(
                    [sys.executable, str(HARNESS), "--serve"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=f,
                    env=dict(key),
                    start_new_session=True,
                )
            self.servers[key] = (proc, log)
        return key, proc, log

    def run(self, argv: list[str], env: dict[str, str], timeout: int) -> dict:
        """What ``python tt_harness.py ARGV`` with ``env`` gave: returncode, stdout, stderr."""
        key, proc, log = self._server(env)
        assert proc.stdin is not None and proc.stdout is not None
        request = {"argv": argv, "env": env, "cwd": os.getcwd()}
        proc.stdin.write((json.dumps(request) + "\n").encode())
        proc.stdin.flush()
        if not select.select([proc.stdout], [], [], timeout)[0]:
            self._stop(self.servers.pop(key)[0])
            raise subprocess.TimeoutExpired(proc.args, timeout)
        line = proc.stdout.readline()
        assert line, f"the tt_harness server ended: {log.read_text(errors='replace')[-3000:]}"
        answer = json.loads(line)
        assert "refused" not in answer, answer["refused"]
        return answer

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def close(self) -> None:
        for proc, _ in self.servers.values():
            assert proc.stdin is not None
            proc.stdin.close()  # the server ends at the end of its input
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._stop(proc)
        self.servers.clear()


@pytest.fixture(scope="module")
def tt(tmp_path_factory):
    h = Harness(tmp_path_factory.mktemp("tt_harness"))
    yield h
    h.close()


def harness(
    tt: Harness,
    pci: Path,
    vfio: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: int = 300,
) -> dict:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("TPU_", "TORCH_TPU_", "JOB_COMPLETION", "MASTER_", "NNODES", "NODE_RANK", "AIOS_")
        )
    }
    base.update(TPU_SKIP_MDS_QUERY="1", **(env or {}))
    out = tt.run([str(pci), str(vfio), *args], base, timeout)
    assert out["returncode"] == 0, out["stderr"][-3000:]
    line = [ln for ln in out["stdout"].splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_import_and_registration_with_faked_pci_count(tt, tmp_path):
    pci, vfio = tpu_sysfs(tmp_path, "v6e", 4)
    facts = harness(tt, pci, vfio, "register")
    assert (
        facts["is_available"] is True and facts["device_count"] == 4 and facts["current"] == "tpu"
    )
    assert facts["privateuse1"] == "tpu"
    assert set(facts["pg_backends"]) == {
        "tpu",
        "tpu_dist",
    }  # the accelerator's dist_backend "tpu" exists
    assert "tpu" in facts["compile_backends"]  # torch.compile(backend="tpu")
    # fused AdamW: TorchTPU registers the kernel and torch lists tpu as fused-capable
    assert facts["fused_adamw_kernel"] is True and "tpu" in facts["fused_devices"]
    # aios's own discovery reads the same fixture and agrees
    assert len(SysfsSource(pci).chips()) == 4


def test_unbound_chips_are_not_counted_by_torch_tpu(tt, tmp_path):
    pci, vfio = tpu_sysfs(tmp_path, "v5e", 4)
    for f in list(vfio.iterdir())[:2]:  # two chips not bound to VFIO
        f.unlink()
    assert harness(tt, pci, vfio, "register")["device_count"] == 2


def test_no_chip_leaves_the_device_unregistered(tt, tmp_path):
    pci, vfio = tpu_sysfs(tmp_path, "v6e", 0)
    facts = harness(tt, pci, vfio, "register")
    assert facts["is_available"] is False and facts["device_count"] == 0
    assert facts["privateuse1"] == "privateuseone" and facts["pg_backends"] == []


def test_runs_forked_from_the_shared_import_start_as_fresh_processes(tt, tmp_path):
    """The harness's server imports once and forks each run: a run's registration, redirect and
    environment stay in its own process, and the server itself never registers a device."""
    pci, vfio = tpu_sysfs(tmp_path / "a", "v6e", 4)
    none_pci, none_vfio = tpu_sysfs(tmp_path / "b", "v6e", 0)
    runs = [
        harness(tt, pci, vfio, "register"),
        harness(tt, none_pci, none_vfio, "register"),
        harness(tt, pci, vfio, "register"),
    ]
    assert [r["device_count"] for r in runs] == [4, 0, 4]
    assert [r["privateuse1"] for r in runs] == ["tpu", "privateuseone", "tpu"]
    env = {"TPU_WORKER_HOSTNAMES": "h0,h1", "JOB_COMPLETION_INDEX": "1"}
    assert harness(tt, pci, vfio, "launch_env", "2", "4", env=env)["NODE_RANK"] == "1"
    assert harness(tt, pci, vfio, "launch_env", "-", "-")["TORCH_TPU_TOPOLOGY"] == "2,2,1"
    assert "NODE_RANK" not in harness(tt, pci, vfio, "launch_env", "-", "-")


def _cfg(*overrides: str):
    return resolve(overrides=["backend=tpu", *overrides], flags={}, environ={}, check_backend=False)


FIELDS_MULTI = (
    "TORCH_TPU_SLICEBUILDER_ADDRESSES",
    "TORCH_TPU_TOPOLOGY",
    "NNODES",
    "NODE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


# one TorchTPU process each (5-15 s): the generations and both host sizes, not every type
@pytest.mark.parametrize(
    "acc,generation,chips", [("v5litepod-8", "v5e", 8), ("v5p-8", "v5p", 4), ("v6e-4", "v6e", 4)]
)
def test_single_host_env_matches_set_tpu_launch_env(
    tt, tmp_path, clean_env, acc, generation, chips
):
    pci, vfio = tpu_sysfs(tmp_path, generation, chips)
    theirs = harness(tt, pci, vfio, "launch_env", "-", "-")
    facts = discover(sysfs=SysfsSource(pci), environ={}, use_metadata=False)
    ours = T.tpu_launch_plan(
        _cfg(f"xla.accelerator={acc}"), LaunchRequest("train.py"), facts
    ).hosts[0]
    assert ours.nprocs == facts.pci_chips == chips
    assert ours.env["TORCH_TPU_TOPOLOGY"] == theirs["TORCH_TPU_TOPOLOGY"]
    # the same number of slice-builder addresses, all on localhost; TorchTPU picks free ports
    # at random, aios uses base_port + local rank (known in advance, shown by --dry-run)
    t_addr, o_addr = (
        theirs["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(","),
        ours.env["TORCH_TPU_SLICEBUILDER_ADDRESSES"].split(","),
    )
    assert len(t_addr) == len(o_addr) == chips
    assert (
        {a.rsplit(":", 1)[0] for a in t_addr}
        == {a.rsplit(":", 1)[0] for a in o_addr}
        == {"localhost"}
    )
    # single host: TorchTPU sets no rendezvous variables, neither does aios's host env
    assert not {"NNODES", "NODE_RANK", "MASTER_ADDR"} & set(theirs) and not {
        "NNODES",
        "NODE_RANK",
    } & set(ours.env)


@pytest.mark.parametrize(
    "acc,generation,hosts", [("v5litepod-16", "v5e", 4), ("v5p-16", "v5p", 2), ("v6e-32", "v6e", 8)]
)
def test_multi_host_env_matches_set_tpu_launch_env_field_by_field(
    tt, tmp_path, clean_env, acc, generation, hosts
):
    pci, vfio = tpu_sysfs(tmp_path, generation, 4)
    names = [f"{acc}-w{i}.tpu.internal" for i in range(hosts)]
    plan = T.tpu_launch_plan(
        _cfg(f"xla.accelerator={acc}"),
        LaunchRequest("train.py", hosts=[Host(n) for n in names]),
        TpuFacts(),
    )
    for rank in (hosts - 1,):  # the last host: every field differs from host 0's defaults
        theirs = harness(
            tt,
            pci,
            vfio,
            "launch_env",
            str(hosts),
            "4",
            env={"TPU_WORKER_HOSTNAMES": ",".join(names), "JOB_COMPLETION_INDEX": str(rank)},
        )
        ours = plan.hosts[rank].env
        for key in FIELDS_MULTI:
            assert ours[key] == theirs[key], key
        assert plan.hosts[rank].nprocs == 4


def test_multi_host_gke_pod_env_built_by_the_launcher_matches(tt, tmp_path):
    """A GKE pod gets one template for every host; the aios launcher completes it from
    JOB_COMPLETION_INDEX as TorchTPU would."""
    from aios_backend_xla.tpu_launcher import host_env

    pci, vfio = tpu_sysfs(tmp_path, "v6e", 4)
    names = "p0.js,p1.js,p2.js,p3.js"
    theirs = harness(
        tt,
        pci,
        vfio,
        "launch_env",
        "-",
        "4",
        env={"TPU_WORKER_HOSTNAMES": names, "JOB_COMPLETION_INDEX": "1"},
    )
    pod = {
        "TPU_WORKER_HOSTNAMES": names,
        "JOB_COMPLETION_INDEX": "1",
        "TORCH_TPU_TOPOLOGY": "2,2,1",
        "TPU_SKIP_MDS_QUERY": "1",
    }
    ours = {**pod, **host_env(pod, 4, "p1")}
    for key in FIELDS_MULTI:
        assert ours[key] == theirs[key], key


def _cli(code: str, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "TPU_", "PJRT_", "GCE_"))
    }
    env.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", **(env_extra or {}))
    wrapped = (
        f"import sys\ntry:\n{code}\nexcept SystemExit:\n    pass\nfinally:\n"
        "    print('HEAVY', sorted(m for m in ('torch','torch_tpu','libtpu','torch_xla') if m "
        "in sys.modules), file=sys.stderr)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", wrapped], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["aios", "--help"],
        ["aios", "devices"],
        ["aios", "devices", "--backend", "tpu"],
        ["aios", "doctor", "--backend", "tpu"],
        ["aios", "doctor"],
        ["aios", "plugins"],
    ],
)
def test_no_cli_command_imports_torch_tpu(argv):
    mod = "aios.cli.main"
    out = _cli(f"    sys.argv={argv!r}\n    from {mod} import main\n    main()")
    assert "HEAVY []" in out.stderr, out.stderr[-2000:]


def test_dry_run_does_not_import_torch_tpu(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    out = _cli(
        "    "
        f"sys.argv=['aios-run','--backend','tpu','--dry-run','xla.accelerator=v6e-8',{str(script)!r}]\n "
        "   from aios.cli.run import main\n    main()"
    )
    assert "HEAVY []" in out.stderr and "TORCH_TPU_TOPOLOGY=2,4,1" in out.stdout, out.stderr[-2000:]


def test_doctor_reports_the_installed_version_set():
    from aios_backend_xla.doctor import tpu_checks

    checks = {
        c.name: c
        for c in tpu_checks(
            None, environ={"AIOS_TEST_DMI_PRODUCT": "/nonexistent"}, facts=TpuFacts()
        )
    }
    assert (
        checks["torch_tpu installed"].status == "pass"
        and checks["torch_tpu installed"].message == "torch_tpu 0.2.0"
    )
    assert (
        checks["version set"].status == "pass"
        and "TorchTPU 0.2 (torch_tpu 0.2.0, torch 2.13.0" in checks["version set"].message
    )


def test_example_training_step_on_tpu_under_fake_tensor_mode(tt, tmp_path):
    """The example GPT through the tpu accelerator, core's bf16-mixed policy and the native DDP
    strategy: parameters placed on tpu, autocast with bf16 passed explicitly (TorchTPU's default
    is float16), one rank. FakeTensorMode: shapes and devices only; the
    backward pass needs the device's autograd queues, which exist only with a TPU runtime."""
    pci, vfio = tpu_sysfs(tmp_path, "v6e", 4)
    r = harness(tt, pci, vfio, "step", "bf16-mixed", "1")
    assert r["accelerator"] == "tpu" and r["device"] == "tpu" and r["param_devices"] == ["tpu"]
    assert r["dist_backend"] == "tpu" and r["compile_backend"] == "tpu"
    assert r["autocast_dtype"] == "bfloat16" and r["logits_dtype"] == "torch.bfloat16"
    assert r["logits_device"].startswith("tpu") and r["logits_shape"] == [4, 16, 64]
    assert r["loss_dtype"] == "torch.float32" and r["loss_device"].startswith("tpu")
    assert r["strategy"] == "DDPStrategy" and r["wrapped"] == "GPT" and r["world"] == 1


HAVE_TPU = discover(environ={"TPU_SKIP_MDS_QUERY": "1"}, use_metadata=False).pci_chips > 0


@pytest.mark.tpu
@pytest.mark.skipif(
    not HAVE_TPU,
    reason="no TPU attached (no Google TPU PCI device): the real TorchTPU step needs a Cloud TPU VM",
)
def test_real_training_on_a_tpu_vm(tmp_path):
    """On a TPU VM: the example GPT for a few steps through aios-run --backend tpu (one process
    per chip, the tpu process group, bf16 autocast). A subprocess: a failing TPU op aborts."""
    root = HERE.parents[2]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "aios.cli.run",
            "--backend",
            "tpu",
            "--precision",
            "bf16-mixed",
            f"checkpoint.dir={tmp_path / 'ckpt'}",
            str(root / "examples" / "gpt.py"),
            "--steps",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
