"""XlaStrategy pieces in-process on XLA:CPU, the launcher, and 'discovery never starts the runtime'."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.xla


@pytest.fixture
def strategy(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    from aios.config.schema import resolve
    from aios_backend_xla.strategy import XlaStrategy

    cfg = resolve(overrides=["xla.allow_cpu=true"], environ={}, check_backend=False)
    s = XlaStrategy(cfg, pjrt_device="CPU")
    s.setup_environment()
    yield s
    s.teardown()


def test_setup_environment_is_explicit_about_the_device(strategy):
    assert os.environ["PJRT_DEVICE"] == "CPU"
    assert strategy.device.type == "xla" and strategy.world_size == 1 and strategy.rank == 0


def test_wrong_pjrt_device_is_refused(monkeypatch):
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    from aios.config.schema import resolve
    from aios.errors import ConfigError
    from aios_backend_xla.strategy import XlaStrategy

    with pytest.raises(ConfigError, match="PJRT_DEVICE=CPU but the xla backend was set up for TPU"):
        XlaStrategy(resolve(environ={}, check_backend=False), pjrt_device="TPU").setup_environment()


def _tied_model():
    import torch

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight
            self.register_buffer("scale", torch.ones(4))

        def forward(self, idx):
            return self.head(self.emb(idx) * self.scale)

    return M()


def test_tied_weights_stay_tied_and_an_early_optimizer_follows_the_move(strategy):
    import torch
    import torch_xla
    from aios.strategies.precision import Precision

    torch.manual_seed(0)
    m = _tied_model()
    opt = torch.optim.SGD(m.parameters(), lr=0.5)  # built before setup, on CPU tensors
    m = strategy.setup_module(m, Precision("xla"))
    opt = strategy.setup_optimizer(opt)
    assert m.emb.weight is m.head.weight and m.emb.weight.device.type == "xla"
    assert opt.param_groups[0]["params"][0] is m.emb.weight
    before = m.emb.weight.detach().cpu().clone()
    idx = torch.tensor([[1, 2, 3]]).to(strategy.device)
    loss = torch.nn.functional.cross_entropy(m(idx).view(-1, 10), idx.view(-1))
    loss.backward()
    strategy.optimizer_step(opt, Precision("xla"))
    strategy.mark_step()
    assert not torch.equal(before, m.emb.weight.detach().cpu())
    torch_xla.sync()


def test_fallback_move_when_swapping_is_impossible_keeps_ties_and_remaps(strategy):
    import weakref

    import torch
    from aios.strategies.precision import Precision

    m = _tied_model()
    old = m.emb.weight
    ref = weakref.ref(old)  # a weak reference makes torch's swap-on-conversion impossible
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    m = strategy.setup_module(m, Precision("xla"))
    opt = strategy.setup_optimizer(opt)
    assert ref() is not None
    assert m.emb.weight is m.head.weight and m.emb.weight.device.type == "xla"
    assert m.emb.weight is not old  # the fallback path ran
    assert opt.param_groups[0]["params"][0] is m.emb.weight


def test_fused_adamw_is_switched_off_with_a_warning(strategy):
    import torch
    from aios.strategies.precision import Precision

    m = strategy.setup_module(torch.nn.Linear(4, 4), Precision("xla"))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, fused=True)
    with pytest.warns(UserWarning, match=r"AdamW\(fused=True\) selects a CUDA kernel"):
        opt = strategy.setup_optimizer(opt)
    assert opt.defaults["fused"] is False and all(g["fused"] is False for g in opt.param_groups)
    m(torch.randn(2, 4).to(strategy.device)).sum().backward()
    strategy.optimizer_step(opt, Precision("xla"))
    strategy.mark_step()


def test_checkpoint_state_is_on_cpu_on_the_master(strategy):
    import torch
    from aios.strategies.precision import Precision

    m = strategy.setup_module(torch.nn.Linear(3, 2), Precision("xla"))
    opt = strategy.setup_optimizer(torch.optim.Adam(m.parameters()))
    m(torch.randn(5, 3).to(strategy.device)).sum().backward()
    strategy.optimizer_step(opt, Precision("xla"))
    strategy.mark_step()
    sd = strategy.module_state_dict(m)
    osd = strategy.optimizer_state_dict(opt)
    assert all(v.device.type == "cpu" for v in sd.values())
    assert all(
        t.device.type == "cpu"
        for st in osd["state"].values()
        for t in st.values()
        if hasattr(t, "device")
    )
    m2 = strategy.setup_module(torch.nn.Linear(3, 2), Precision("xla"))
    strategy.load_module_state_dict(m2, sd)
    assert torch.equal(m2.weight.cpu(), m.weight.cpu())


def test_loader_drops_the_short_batch_and_keeps_position(strategy):
    import torch

    ds = torch.utils.data.TensorDataset(torch.arange(20.0).view(10, 2))
    dl = strategy.setup_dataloader(torch.utils.data.DataLoader(ds, batch_size=4, shuffle=False))
    assert len(dl) == 2
    batches = [b[0] for b in dl]
    assert [tuple(b.shape) for b in batches] == [(4, 2), (4, 2)]
    assert batches[0].device.type == "xla"
    assert dl.state_dict() == {"epoch": 1, "batch": 0, "samples": 0, "world": 1, "batch_size": 4}
    dl.load_state_dict({"epoch": 1, "batch": 1})
    rest = [b[0].cpu() for b in dl]
    assert len(rest) == 1 and torch.equal(rest[0], ds.tensors[0][4:8])
    for _ in dl:  # an iteration abandoned part-way stops the background transfer thread
        break
    assert dl._mp._parallel_loader._done and dl.state_dict()["epoch"] == 2
    assert (dl.state_dict()["batch"], dl.state_dict()["samples"]) == (1, 4)


def test_rng_state_roundtrip(strategy):
    strategy.seed(123)
    st = strategy.rng_state()
    assert st == {"xla": 123}
    strategy.set_rng_state({"xla": 7})
    assert strategy.rng_state() == {"xla": 7}
    g = strategy.generator(5)
    assert g.device.type == "cpu"


# ------------------------------------------------------------------------------ no runtime init


_NO_INIT = r"""
import os, sys, json
os.environ["PJRT_DEVICE"] = "CPU"
os.environ["AIOS_XLA__ALLOW_CPU"] = "1"
from aios.cli.main import cli
for args in (["devices", "--json"], ["plugins"]):
    try:
        cli(args, standalone_mode=False)
    except SystemExit:
        pass
from aios.cli.run import build_plan
open("t.py", "w").write("")
cfg, spec, plan, notes = build_plan("t.py", [], ["xla.accelerator=v4-16"], {"backend": "xla"}, None, check=False)
assert plan.world_size == 8
from aios.plugins.registry import get_registry
get_registry().discover_devices("xla", cfg)
assert get_registry().probe("xla")
heavy = sorted(m for m in ("torch", "torch_xla") if m in sys.modules)
import torch_xla
print("RESULT", json.dumps({"heavy_before": heavy, "initialized": bool(torch_xla._XLAC._xla_runtime_is_initialized())}))
"""


def test_discovery_devices_and_dry_run_never_start_the_runtime(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _NO_INIT],
        capture_output=True,
        text=True,
        timeout=200,
        cwd=tmp_path,
        env={**os.environ, "AIOS_TEST_DMI_PRODUCT": "/nonexistent"},
    )
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.rpartition("RESULT ")[2])
    assert res == {"heavy_before": [], "initialized": False}


# ------------------------------------------------------------------------------ launcher


def _launcher(tmp_path, args, env):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "AIOS_", "TPU_"))}
    e.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", **env)
    return subprocess.run(
        [sys.executable, "-m", "aios_backend_xla.launcher", *args],
        capture_output=True,
        text=True,
        timeout=200,
        env=e,
        cwd=tmp_path,
    )


def test_launcher_refuses_without_pjrt_device_or_tpu(tmp_path):
    (tmp_path / "s.py").write_text("print('RAN')\n")
    out = _launcher(tmp_path, ["s.py"], {})
    assert (
        out.returncode == 2 and "PJRT_DEVICE is not set" in out.stderr and "RAN" not in out.stdout
    )
    out = _launcher(tmp_path, ["s.py"], {"PJRT_DEVICE": "TPU"})
    assert (
        out.returncode == 2
        and "no TPU was found" in out.stderr
        and "AIOS_XLA__ALLOW_CPU=1" in out.stderr
    )
    out = _launcher(tmp_path, ["--nprocs", "4", "s.py"], {"PJRT_DEVICE": "CPU"})
    assert out.returncode == 2 and "--nprocs 4" in out.stderr and "RAN" not in out.stdout


def test_launcher_accepts_the_plans_chip_count_on_a_tpu_vm(tmp_path, fake_sysfs):
    # A fake TPU VM (4 v4 chips on the PCI bus): the plan's `--nprocs 4` passes the checks and
    # the launcher gets as far as torch_xla.launch, which then needs a real TPU (libtpu).
    root = fake_sysfs([("0x1ae0", "0x005e")] * 4)
    (tmp_path / "s.py").write_text("print('RAN')\n")
    out = _launcher(
        tmp_path,
        ["--nprocs", "3", "s.py"],
        {
            "PJRT_DEVICE": "TPU",
            "AIOS_TEST_SYSFS_PCI": str(root),
            "TPU_ACCELERATOR_TYPE": "v4-8",
            "TPU_SKIP_MDS_QUERY": "1",
        },
    )
    assert out.returncode == 2 and "the 4 local chips" in out.stderr
    from aios_backend_xla.launcher import parse

    assert parse(["--nprocs", "4", "-m", "pkg.train", "--lr", "1"]).args == ["--lr", "1"]


def test_launcher_runs_the_unchanged_script_through_torch_xla_launch(tmp_path):
    (tmp_path / "s.py").write_text(
        "import sys, os, torch, torch_xla\n"
        "t = torch.ones(2, device=torch_xla.device()) * 3\n"
        "print('ARGS', sys.argv[1:], os.environ.get('AIOS_RUN_LOCAL_INDEX'), float(t.sum()), __name__)\n"
    )
    out = _launcher(tmp_path, ["--nprocs", "1", "s.py", "--lr", "3"], {"PJRT_DEVICE": "CPU"})
    assert out.returncode == 0, out.stderr
    assert "ARGS ['--lr', '3'] 0 6.0 __main__" in out.stdout


def test_doctor_deep_checks_in_the_xla_env(tmp_path):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PJRT_", "AIOS_", "TPU_"))}
    e.update(AIOS_TEST_DMI_PRODUCT="/nonexistent", AIOS_XLA__ALLOW_CPU="1")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from aios.cli.main import main; main()",
            "doctor",
            "--backend",
            "xla",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env=e,
    )
    res = {c["name"]: c for c in json.loads(out.stdout)}
    assert res["torch/torch_xla versions"]["status"] == "pass"
    assert res["runtime before spawn"]["status"] == "pass"
    assert res["TPU attached"]["status"] == "warn"
