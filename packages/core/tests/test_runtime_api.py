"""The runtime API in one process on the CPU backend: resolution at init, setup, the step
(accumulation, clipping, precision), logging and run records, seeding, save/load/resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import aios  # noqa: E402
from aios.errors import AiosError, BackendUnavailable, CheckpointError, ConfigError  # noqa: E402
from aios.plugins.registry import reset_registry  # noqa: E402


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith(("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AIOS_LOGGING__RUN_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "false")
    monkeypatch.chdir(tmp_path)
    reset_registry()
    yield
    rt = aios.current()
    if rt is not None:
        rt.close()
    reset_registry()


def _data(n: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return torch.utils.data.TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))


def _train(rt, steps: int, model=None, batch: int = 8, lr: float = 0.05, shuffle: bool = True):
    torch.manual_seed(0)
    model = model or torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(_data(), batch_size=batch, shuffle=shuffle, drop_last=True)
    model, opt, loader = rt.setup(model, opt, loader)
    while rt.global_step < steps:
        for x, y in loader:
            with rt.accumulate(model), rt.autocast():
                loss = torch.nn.functional.mse_loss(model(x), y)
                rt.backward(loss)
            rt.step(opt)
            if rt.global_step >= steps:
                break
    return model, opt, loader


def test_runtime_init_resolves_backend_and_identity():
    rt = aios.init()
    assert rt.backend == "cpu"
    assert rt.device == torch.device("cpu")
    assert (rt.rank, rt.local_rank, rt.world_size, rt.is_main) == (0, 0, 1, True)
    assert type(rt.strategy).__name__ == "DDPStrategy"
    assert rt.precision.name == "fp32"
    assert aios.init() is rt  # one runtime per process
    assert aios.current() is rt
    rt.close()
    assert aios.current() is None


def test_runtime_explicit_unknown_or_unavailable_backend_is_an_error():
    with pytest.raises(BackendUnavailable, match="unknown backend 'nosuch'"):
        aios.init(backend="nosuch")
    with pytest.raises(ConfigError, match="precision"):
        aios.init(precision="fp8")


def test_runtime_config_precedence_defaults_env_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("AIOS_GRAD_ACCUM", "3")
    rt = aios.init(defaults={"grad_accum": 2, "seed": 5, "checkpoint": {"every": 7}}, grad_clip=0.5)
    assert rt.config.grad_accum == 3  # env beats the script's defaults
    assert rt.config.seed == 5  # defaults beat the schema
    assert rt.config.checkpoint.every == 7
    assert rt.config.grad_clip == 0.5  # flags win


def test_runtime_aios_run_config_env_is_used(monkeypatch):
    monkeypatch.setenv(
        "AIOS_RUN_CONFIG",
        json.dumps({"backend": "cpu", "precision": "bf16-mixed", "grad_accum": 4}),
    )
    rt = aios.init(defaults={"grad_accum": 2, "seed": 9})
    assert rt.config.precision == "bf16-mixed" and rt.config.grad_accum == 4 and rt.config.seed == 9


def test_runtime_setup_returns_objects_in_order_and_shards_loader():
    rt = aios.init()
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2)
    loader = torch.utils.data.DataLoader(_data(), batch_size=8)
    m, o, s, ld = rt.setup(model, opt, sched, loader)
    assert m is model and o is opt and s is sched  # single process: no DDP wrapper
    assert len(ld) == 8 and sum(1 for _ in ld) == 8
    assert ld.state_dict() == {"epoch": 1, "batch": 0, "samples": 0, "world": 1, "batch_size": 8}
    with pytest.raises(AiosError, match="setup"):
        rt.setup(42)


def test_runtime_grad_accumulation_matches_big_batch():
    rt = aios.init(grad_accum=2, seed=0)
    m1, _, _ = _train(rt, 4, batch=4, shuffle=False)
    w_accum = m1.weight.detach().clone()
    rt.close()
    rt = aios.init(grad_accum=1, seed=0)
    m2, _, _ = _train(rt, 4, batch=8, shuffle=False)
    torch.testing.assert_close(w_accum, m2.weight.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.equal(w_accum, torch.nn.Linear(4, 1).weight)


def test_runtime_step_returns_false_on_micro_steps_and_counts():
    rt = aios.init(grad_accum=3)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = rt.setup(model, opt)
    taken = []
    for _ in range(6):
        rt.backward(model(torch.ones(2, 4)).sum())
        taken.append(rt.step(opt))
    assert taken == [False, False, True, False, False, True]
    assert rt.global_step == 2
    assert all(p.grad is None for p in model.parameters())  # zeroed after the step


def test_runtime_grad_clip_limits_norm():
    rt = aios.init(grad_clip=0.01)
    model = torch.nn.Linear(4, 1)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model, opt = rt.setup(model, opt)
    rt.backward((model(torch.full((2, 4), 100.0)) ** 2).sum())
    rt.step(opt)
    assert float(rt.last_grad_norm) > 1.0
    delta = torch.cat([(model.weight - before).flatten(), model.bias.detach().flatten()])
    assert delta.norm() <= 0.01 + 1e-3 + before.abs().max()  # bounded by the clip (plus bias init)
    assert (model.weight - before).norm() <= 0.0101


def test_runtime_bf16_autocast_on_cpu():
    rt = aios.init(precision="bf16-mixed")
    model = rt.setup(torch.nn.Linear(4, 4))
    with rt.autocast():
        out = model(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16
    assert model(torch.ones(2, 4)).dtype == torch.float32


def test_runtime_seed_everything_is_deterministic():
    rt = aios.init(seed=123)
    a = torch.rand(3)
    rt.seed_everything(123)
    assert torch.equal(a, torch.rand(3))


def test_runtime_log_and_run_record(tmp_path):
    rt = aios.init(seed=1, defaults={"logging": {"run_dir": str(tmp_path / "r")}})
    _train(rt, 3)
    rt.log({"loss": torch.tensor(0.5), "lr": 0.1})
    rt.log({"skipped": 1.0}, every=2)  # step 3: not a multiple of 2
    rt.close()
    d = Path(rt.run_dir)
    assert d.parent == tmp_path / "runs" or d.parent == tmp_path / "r"
    lines = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 3, "time": lines[0]["time"], "loss": 0.5, "lr": 0.1}]
    diag = json.loads((d / "diagnostics.json").read_text())
    assert diag["backend"] == "cpu" and diag["world_size"] == 1 and diag["status"] == "finished"
    assert (
        diag["steps"] == 3
        and diag["step_timing"]["count"] == 2
        and diag["step_timing"]["first_step_s"] > 0
    )
    assert "torch" in diag["versions"] and diag["devices"]["backend"] == "cpu"
    assert "max_rss_bytes" in diag["backend_metrics"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["seed"] == 1


def test_runtime_secrets_never_reach_run_records(tmp_path, monkeypatch):
    from aios.runtime import explicit_config_json

    monkeypatch.setenv("WANDB_API_KEY", "sekrit-123")
    rt = aios.init()
    rt.close()
    text = "".join(p.read_text() for p in Path(rt.run_dir).glob("*.json"))
    assert "sekrit-123" not in text
    assert "sekrit" not in explicit_config_json(rt.config)


def test_runtime_tensorboard_logger_writes_events(monkeypatch, tmp_path):
    pytest.importorskip("tensorboard")
    monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "true")
    rt = aios.init()
    rt.log({"loss": 1.5}, step=1)
    rt.close()
    events = list((Path(rt.run_dir) / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0


def test_runtime_save_load_roundtrip_full_state(tmp_path):
    ckpt = tmp_path / "ck"
    rt = aios.init(seed=0, checkpoint={"dir": str(ckpt), "every": 2, "keep": 2})
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    loader = torch.utils.data.DataLoader(_data(), batch_size=8, shuffle=True, drop_last=True)
    model, opt, sched, loader = rt.setup(model, opt, sched, loader)
    it = iter(loader)
    for _ in range(5):
        x, y = next(it)
        rt.backward(torch.nn.functional.mse_loss(model(x), y))
        rt.step(opt)
        sched.step()
    next(it)  # runs the pending checkpoint? no: step 5 is not a multiple of 2
    names = sorted(p.name for p in ckpt.iterdir() if p.name != ".aios-lock")  # held while running
    assert names == ["ckpt-000000002", "ckpt-000000004"]
    path = rt.save()
    assert path.endswith("ckpt-000000005")
    assert sorted(p.name for p in ckpt.iterdir() if p.name != ".aios-lock") == [
        "ckpt-000000004",
        "ckpt-000000005",
    ]  # keep=2
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_rand = torch.rand(2)
    want_lr = sched.get_last_lr()
    # perturb everything, then load
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    sched.step()
    extra = rt.load()
    assert extra == {}
    assert all(torch.equal(want[k], v) for k, v in model.state_dict().items())
    assert sched.get_last_lr() == want_lr
    assert rt.global_step == 5
    assert torch.equal(torch.rand(2), want_rand)  # RNG restored
    st = loader.state_dict()
    assert (st["epoch"], st["batch"], st["samples"]) == (0, 6, 6 * st["batch_size"])


def test_runtime_resume_without_checkpoints_starts_at_zero(tmp_path):
    rt = aios.init(checkpoint={"dir": str(tmp_path / "empty")})
    rt.setup(torch.nn.Linear(2, 2))
    assert rt.resume() == 0


def test_runtime_resume_says_a_skipped_incomplete_checkpoint_in_one_aios_line(tmp_path, capsys):
    """An interrupted save newer than the checkpoint resumed: one ``aios:`` line on rank 0's
    output as the other resume notices, not a UserWarning with aios's source path in front."""
    import warnings

    ckpt = tmp_path / "c"
    rt = aios.init(checkpoint={"dir": str(ckpt)})
    _train(rt, 2)
    rt.save()
    rt.close()
    (ckpt / "ckpt-000000009").mkdir()
    (ckpt / "ckpt-000000009" / "state.pt").write_bytes(b"half a file")
    capsys.readouterr()
    rt = aios.init(checkpoint={"dir": str(ckpt)})
    model = torch.nn.Linear(4, 1)
    rt.setup(model, torch.optim.SGD(model.parameters(), lr=0.05))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert rt.resume() == 2
    out = capsys.readouterr()
    assert [str(w.message) for w in caught if "skipping" in str(w.message)] == []
    lines = [ln for ln in out.out.splitlines() if "skipping incomplete checkpoint" in ln]
    assert len(lines) == 1 and lines[0].startswith("aios: skipping incomplete checkpoint "), out
    assert "ckpt-000000009" in lines[0] and "manager.py" not in out.err + out.out


def test_runtime_load_mismatched_model_is_one_line_error(tmp_path):
    rt = aios.init(checkpoint={"dir": str(tmp_path / "c")})
    model = rt.setup(torch.nn.Linear(4, 1))
    rt.save()
    rt.close()
    rt = aios.init(checkpoint={"dir": str(tmp_path / "c")})
    rt.setup(torch.nn.Linear(4, 2))
    with pytest.raises(CheckpointError, match="does not fit") as ei:
        rt.resume()
    assert "\n" not in str(ei.value) and "checkpoint.resume=false" in str(ei.value)
    del model


def test_runtime_unwritable_checkpoint_dir_fails_at_init(tmp_path):
    if os.geteuid() == 0:
        target = "/proc/aios-cannot-write-here"
    else:  # pragma: no cover
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        target = str(ro / "c")
    with pytest.raises(CheckpointError, match="not writable"):
        aios.init(checkpoint={"dir": target})


def test_runtime_final_checkpoint_on_close(tmp_path):
    ckpt = tmp_path / "c"
    rt = aios.init(checkpoint={"dir": str(ckpt)})  # every=0: only at the end
    _train(rt, 3)
    assert [p.name for p in ckpt.iterdir()] == [".aios-lock"]  # the writer lock, no checkpoint yet
    rt.close()
    assert [p.name for p in ckpt.iterdir()] == ["ckpt-000000003"]  # lock released


def test_runtime_checkpoint_to_fsspec_memory_url():
    import fsspec

    rt = aios.init(seed=0, checkpoint={"dir": "memory://aios-test/ck"})
    model, opt, _ = _train(rt, 2)
    path = rt.save()
    assert path == "memory://aios-test/ck/ckpt-000000002"
    fs = fsspec.filesystem("memory")
    assert fs.exists("/aios-test/ck/ckpt-000000002/aios-checkpoint.json")
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.zero_()
    assert rt.resume() == 2
    assert all(torch.equal(want[k], v) for k, v in model.state_dict().items())
    fs.rm("/aios-test", recursive=True)
