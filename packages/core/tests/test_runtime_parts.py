"""Issue 12 item 5: the runtime in parts that can be tested alone: the training state
(aios.checkpoint.state), the checkpoint manager (aios.checkpoint.manager) with its public batch-boundary
callback and pluggable checkpoint formats, side-effect-free constructors, and the
launcher<->worker contract in one module (aios.launcher.contract)."""

from __future__ import annotations

import ast
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest
from aios.testing.zygote import python

torch = pytest.importorskip("torch")

import aios  # noqa: E402
from aios.plugins.registry import get_registry, reset_registry  # noqa: E402

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith(("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "false")
    monkeypatch.chdir(tmp_path)
    reset_registry()
    yield
    rt = aios.current()
    if rt is not None:
        rt.close()
    reset_registry()


def _parts(tmp_path, **checkpoint):
    from aios.runtime import resolve_config
    from aios.strategies.ddp import DDPStrategy
    from aios.strategies.precision import default_precision

    cfg = resolve_config({"checkpoint": checkpoint, "logging": {"run_dir": str(tmp_path / "runs")}})
    strategy = DDPStrategy(cfg)
    strategy.setup_environment()
    return cfg, strategy, default_precision("fp32", "cpu")


def test_training_state_alone_roundtrips_modules_objects_counters_and_rng(tmp_path):
    from aios.checkpoint.state import TrainingState

    _, strategy, precision = _parts(tmp_path)
    ts = TrainingState(strategy, precision, "cpu")
    model = strategy.setup_module(torch.nn.Linear(3, 2), precision)
    ts.modules.append(model)

    class Counter:
        n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, s):
            self.n = s["n"]

    c = ts.register("counter", Counter())
    c.n, ts.step, ts.micro = 7, 11, 22
    state = ts.state_dict()
    state["rng"] = [ts.rng_state()]
    want = torch.rand(3)
    with torch.no_grad():
        model.weight.add_(1.0)
    c.n, ts.step = 0, 0
    ts.load_state_dict(state)
    assert (c.n, ts.step, ts.micro) == (7, 11, 22)
    assert torch.equal(model.weight, state["modules"][0]["weight"])
    assert torch.equal(torch.rand(3), want)
    from aios.errors import AiosError

    with pytest.raises(AiosError, match="needs an object with state_dict"):
        ts.register("bad", object())


def test_checkpoint_manager_alone_no_side_effects_until_start(tmp_path):
    from aios.checkpoint.manager import CheckpointManager
    from aios.checkpoint.state import TrainingState
    from aios.runrecord.records import RunRecord

    ck = tmp_path / "ck"
    cfg, strategy, precision = _parts(tmp_path, dir=str(ck), keep=2)
    ts = TrainingState(strategy, precision, "cpu")
    ts.modules.append(strategy.setup_module(torch.nn.Linear(2, 2), precision))
    threads = threading.active_count()
    mgr = CheckpointManager(
        cfg,
        strategy,
        ts,
        RunRecord(str(tmp_path / "runs"), "r1", active=True),
        "cpu",
        formats=get_registry().checkpoint_formats,
    )
    assert not ck.exists() and threading.active_count() == threads  # nothing until start()
    mgr.start()
    lock = json.loads((ck / ".aios-lock").read_text())
    assert lock["run_id"] == "r1" and lock["pid"] == os.getpid()
    for step in (1, 2, 3):
        ts.step = step
        mgr.request_save()
        assert mgr.pending == "save"
        mgr.at_batch_boundary()  # the public callback loaders call
        assert mgr.pending is None
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("ckpt-")) == [
        "ckpt-000000002",
        "ckpt-000000003",
    ]
    marker = json.loads((ck / "ckpt-000000003" / "aios-checkpoint.json").read_text())
    assert (
        marker["lineage"] == mgr.lineage
        and marker["world_size"] == 1
        and marker["checkpoint_format"] == "full"
    )
    mgr.close()
    assert not (ck / ".aios-lock").exists()


def test_runtime_constructor_has_no_side_effects_start_does_them(tmp_path):
    from aios.runtime import Runtime

    ck = tmp_path / "ck"
    cfg, strategy, precision = _parts(tmp_path, dir=str(ck))
    handler = signal.getsignal(signal.SIGTERM)
    threads = threading.active_count()
    rt = Runtime(cfg, "cpu", strategy, precision, registry=get_registry())
    assert not (tmp_path / "runs").exists() and not ck.exists()
    assert signal.getsignal(signal.SIGTERM) is handler and threading.active_count() == threads
    rt.start()
    try:
        assert Path(rt.run_dir, "diagnostics.json").exists() and (ck / ".aios-lock").exists()
        assert signal.getsignal(signal.SIGTERM) is not handler
    finally:
        rt.close()
    assert signal.getsignal(signal.SIGTERM) is handler and not (ck / ".aios-lock").exists()


def test_device_loader_calls_the_public_batch_boundary():
    from aios.data.loaders import DeviceLoader

    class Owner:
        pending: str | None = None
        calls = 0

        def at_batch_boundary(self):
            self.calls += 1
            self.pending = None

    owner = Owner()
    loader = DeviceLoader([1, 2, 3, 4])
    loader.owner = owner
    seen = []
    for b in loader:
        seen.append(b)
        if b == 2:
            owner.pending = "save"
    assert seen == [1, 2, 3, 4] and owner.calls == 1


SHARDED_JSON_PLUGIN = """
import json

import torch
from aios import hookimpl
from aios.checkpoint.manager import CheckpointFormat
from aios.types import CheckpointFormatSpec


class ShardedJson(CheckpointFormat):
    # every rank writes its own file; rank 0 commits after all are durable
    name = "test-sharded"
    all_ranks_write = True
    supports_resharding = True

    def save(self, step, ctx, staging, store):
        data = {"step": step, "w": ctx.training.modules[0].weight.tolist()}
        return {
            "rank0.json": store.write_file(
                staging, "rank0.json", lambda f: f.write(json.dumps(data).encode())
            )
        }

    def load(self, info, store, target, rank=0, strict=True):
        data = json.loads(store.read_file(info, "rank0.json"))
        with torch.no_grad():
            target.modules[0].weight.copy_(torch.tensor(data["w"]))
        target.step = data["step"]
        return {}


@hookimpl
def aios_register_checkpoint_formats(register):
    register(CheckpointFormatSpec("test-sharded", ShardedJson))
"""


def test_hook_aios_register_checkpoint_formats(tmp_path, monkeypatch):
    """A plugin's ``aios_register_checkpoint_formats`` adds a format; a run saves and resumes
    with it."""
    from importlib.metadata import EntryPoint

    from aios.plugins import registry as plugins_mod
    from aios.plugins.registry import Registry

    site = tmp_path / "site"
    site.mkdir()
    (site / "plug_sharded_json.py").write_text(SHARDED_JSON_PLUGIN)
    monkeypatch.syspath_prepend(str(site))
    reg = Registry(
        entry_points=[
            EntryPoint(name="aios-core", value="aios.plugins.builtin", group="aios"),
            EntryPoint(name="plug-sharded-json", value="plug_sharded_json", group="aios"),
        ]
    )
    assert set(reg.checkpoint_formats) == {"full", "dcp", "test-sharded"}
    assert reg.checkpoint_formats["test-sharded"].plugin == "plug-sharded-json"
    monkeypatch.setattr(plugins_mod, "_registry", reg)
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck)}, logging={"run_dir": str(tmp_path / "runs")})
    try:
        from aios.checkpoint.formats.base import get_format

        rt.strategy.checkpoint_format = "test-sharded"
        rt.checkpointer.format = get_format("test-sharded", rt.checkpointer.formats)
        model = rt.setup(torch.nn.Linear(2, 1))
        rt.training.step = 4
        path = rt.save()
        marker = json.loads(Path(path, "aios-checkpoint.json").read_text())
        assert marker["checkpoint_format"] == "test-sharded" and set(marker["files"]) == {
            "rank0.json"
        }
        want = model.weight.detach().clone()
        with torch.no_grad():
            model.weight.zero_()
        rt.training.step = 0
        assert rt.resume() == 4 and torch.equal(model.weight, want)
    finally:
        sys.modules.pop("plug_sharded_json", None)


def test_launcher_worker_env_names_live_only_in_the_contract_module():
    from aios.launcher import contract

    offenders = []
    for src in sorted(REPO.glob("packages/*/src/**/*.py")):
        if src.name == "contract.py" and src.parent.name == "launcher":
            continue
        tree = ast.parse(src.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("AIOS_RUN_")
            ):
                offenders.append(f"{src.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert offenders == []
    assert all(name.startswith(contract.CONTROL_PREFIX) for name in contract.ALL)


def test_all_ranks_write_format_with_two_processes(tmp_path):
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {"AIOS_LOGGING__RUN_DIR": str(tmp_path / "runs"), "AIOS_LOGGING__TENSORBOARD": "false"}
    )
    ck = tmp_path / "ck"
    script = Path(__file__).parent / "scripts" / "sharded_format.py"
    r = subprocess.run(
        [
            *python("-c", "from aios.cli.run import main; main()"),
            "--nprocs",
            "2",
            "--master-port",
            str(port),
            str(script),
            str(ck),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=400,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "[rank0]:files ['rank0.json', 'rank1.json'] world 2 format test-per-rank" in out
    for rank in (0, 1):
        assert f"[rank{rank}]:save failed: True True" in out, out
        assert f"[rank{rank}]:resumed 3 {2.0 * (rank + 1)}" in out, out
    assert sorted(p.name for p in ck.iterdir()) == [
        "ckpt-000000003"
    ]  # the failed save left nothing


def test_checkpoint_formats_come_from_the_registry_and_are_built_on_use():
    from aios.checkpoint.formats.base import get_format
    from aios.checkpoint.formats.dcp_format import DcpFormat
    from aios.checkpoint.formats.full import FullStateFormat
    from aios.errors import CheckpointError

    formats = get_registry().checkpoint_formats
    assert {"full", "dcp"} <= set(formats) and formats["full"].plugin == "aios-core"
    assert isinstance(get_format("full", formats), FullStateFormat)
    assert isinstance(get_format("dcp", formats), DcpFormat)
    assert get_format("full", formats) is not get_format("full", formats)  # one per manager
    with pytest.raises(CheckpointError, match="checkpoint format 'nope' is not available"):
        get_format("nope", formats)


def test_progress_starts_nothing_until_the_first_update(monkeypatch, capsys):
    from aios.runtime import Progress

    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    threads = threading.active_count()
    p = Progress(10, "train", enabled=True, every=1)
    assert p._bar is None and threading.active_count() == threads
    p.close()


@pytest.mark.parametrize(
    ("setting", "device", "mode"),
    [
        ("auto", "cpu", "process"),
        ("auto", "cuda", "process"),
        # TorchTPU / TorchNeuron: the thread until the checkpoint process is verified there
        ("auto", "tpu", "thread"),
        ("auto", "neuron", "thread"),
        ("process", "tpu", "process"),  # an explicit choice is kept
        ("thread", "cpu", "thread"),
    ],
)
def test_checkpoint_manager_picks_the_dcp_writer_per_device(tmp_path, setting, device, mode):
    from types import SimpleNamespace

    from aios.checkpoint.manager import CheckpointManager
    from aios.checkpoint.state import TrainingState
    from aios.runrecord.records import RunRecord

    cfg, strategy, precision = _parts(tmp_path, dir=str(tmp_path / "ck"), async_writer=setting)
    strategy.checkpoint_format = "dcp"
    strategy.accelerator = SimpleNamespace(device_type=device)
    mgr = CheckpointManager(
        cfg,
        strategy,
        TrainingState(strategy, precision, "cpu"),
        RunRecord(str(tmp_path / "runs"), "r1", active=True),
        "cpu",
        formats=get_registry().checkpoint_formats,
    )
    assert mgr.format.name == "dcp" and mgr.format.io.async_mode == mode


def test_emergency_checkpoint_is_written_when_the_pending_background_save_was_lost(tmp_path):
    """A background save that failed (its writer killed, say) is reported at preemption, and
    the emergency checkpoint is still written by the training process."""
    from aios.checkpoint.formats.full import FullStateFormat
    from aios.checkpoint.manager import CheckpointManager
    from aios.checkpoint.state import TrainingState
    from aios.errors import CheckpointError
    from aios.runrecord.records import RunRecord

    class LostInBackground(FullStateFormat):
        pending: object | None = None

        def wait(self):
            self.pending = None
            raise CheckpointError(
                "the background save of checkpoint step 4 failed (writer killed)",
                "check that checkpoint.dir is writable and has free space",
            )

    ck = tmp_path / "ck"
    cfg, strategy, precision = _parts(tmp_path, dir=str(ck))
    ts = TrainingState(strategy, precision, "cpu")
    ts.modules.append(strategy.setup_module(torch.nn.Linear(2, 2), precision))
    mgr = CheckpointManager(
        cfg,
        strategy,
        ts,
        RunRecord(str(tmp_path / "runs"), "r1", active=True),
        "cpu",
        formats=get_registry().checkpoint_formats,
    )
    mgr.start()
    try:
        mgr.format = LostInBackground()

        class InFlight:  # a save of step 4 is in flight (its handle, as DCP's SaveHandle)
            step = 4

            def done(self) -> bool:
                return False

        mgr.format.pending = InFlight()
        ts.step = 5
        with pytest.warns(UserWarning, match="background save of checkpoint step 4 failed"):
            event = mgr.emergency_save("SIGTERM", 0, lambda: 0.5)
        assert event["step"] == 5 and event["checkpoint"], event
        assert (ck / "ckpt-000000005" / "aios-checkpoint.json").exists()
    finally:
        mgr.close()
