"""Preemption notices from a plugin watcher (aios_preemption_watchers) and from SIGTERM, in one
process: the runtime acts at the step boundary, writes the emergency checkpoint, records the
event and exits with EXIT_PREEMPTED; the next run resumes from it."""

from __future__ import annotations

import json
import os
import signal
import time
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import aios  # noqa: E402
from aios import hookimpl  # noqa: E402
from aios.plugins.registry import get_registry, reset_registry  # noqa: E402
from aios.resilience.notices import EXIT_PREEMPTED, FileWatcher  # noqa: E402


@pytest.fixture(autouse=True)
def clean(monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith(("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK")):
            monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AIOS_LOGGING__RUN_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("AIOS_LOGGING__TENSORBOARD", "false")
    reset_registry()
    yield
    if aios.current() is not None:
        aios.current().close()
    reset_registry()


def _setup(rt):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(400, 4)), batch_size=4, drop_last=True
    )
    return rt.setup(model, opt, loader)


def _train_until_exit(rt, model, opt, loader, on_step=None):
    with pytest.raises(SystemExit) as ei:
        for (x,) in loader:
            rt.backward(model(x).sum())
            rt.step(opt)
            if on_step:
                on_step(rt.global_step)
    return ei.value.code


def test_preempt_watcher_notice_checkpoints_and_exits(tmp_path):
    notice = tmp_path / "preempt-notice"
    plugin = types.ModuleType("watcher_plugin")

    @hookimpl
    def aios_preemption_watchers(config):
        return [FileWatcher(str(notice), interval=0.02)]

    plugin.aios_preemption_watchers = aios_preemption_watchers
    get_registry().pm.register(plugin, name="test-watcher")
    rt = aios.init(checkpoint={"dir": str(tmp_path / "ck")})
    model, opt, loader = _setup(rt)
    fired = {}

    def on_step(step):
        if step == 3:
            notice.touch()
            time.sleep(0.2)  # the watcher thread notices
            fired["at"] = step

    code = _train_until_exit(rt, model, opt, loader, on_step)
    assert code == EXIT_PREEMPTED
    # the notice came after step 3's boundary: acted on at the next one
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["ckpt-000000004"]
    diag = json.loads((Path(rt.run_dir) / "diagnostics.json").read_text())
    assert diag["status"] == "preempted"
    (ev,) = diag["preemptions"]
    assert (
        ev["reason"] == f"notice file {notice}"
        and ev["step"] == 4
        and ev["checkpoint"].endswith("ckpt-000000004")
    )
    assert ev["seconds_since_notice"] < ev["grace_seconds"]
    assert aios.current() is None

    get_registry().pm.unregister(plugin)
    rt = aios.init(checkpoint={"dir": str(tmp_path / "ck")})
    model, opt, loader = _setup(rt)
    assert rt.resume() == 4
    st = loader.state_dict()
    assert (st["epoch"], st["batch"], st["samples"]) == (0, 4, 4 * st["batch_size"])


def test_preempt_sigterm_in_process(tmp_path):
    rt = aios.init(checkpoint={"dir": str(tmp_path / "ck"), "every": 100})
    model, opt, loader = _setup(rt)

    def on_step(step):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # handled: only a flag is set

    code = _train_until_exit(rt, model, opt, loader, on_step)
    assert code == EXIT_PREEMPTED
    assert [p.name for p in (tmp_path / "ck").iterdir()] == ["ckpt-000000006"]  # next boundary
    assert (
        signal.getsignal(signal.SIGTERM) is not rt.preemption._handler
    )  # handler removed at close


def test_preempt_without_checkpoint_dir_still_exits_distinctly(tmp_path):
    rt = aios.init()
    model, opt, loader = _setup(rt)
    rt.preemption.notify("test notice")
    code = _train_until_exit(rt, model, opt, loader)
    assert code == EXIT_PREEMPTED
