"""The run names what reading cannot (issue 34 item 4), at the first backward, once, with the
``file:line`` of the script's ``rt.backward``: a forward that ran on a device other than the
rank's (the model left on the host), and float16 on an accelerator without fp16 speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from aios.config.schema import resolve  # noqa: E402
from aios.devices.accelerator import CpuAccelerator  # noqa: E402
from aios.plugins.registry import get_registry  # noqa: E402
from aios.runtime import Runtime  # noqa: E402
from aios.strategies.ddp import DDPStrategy  # noqa: E402
from aios.strategies.precision import Precision  # noqa: E402


class OnDevice(DDPStrategy):
    """One process whose device is ``self.target`` (meta stands for an accelerator the model
    never reached: nothing computes there, so a loss on it could only come from rt.setup)."""

    target = torch.device("meta")

    def setup_environment(self) -> None:
        self.rank, self.world_size, self.device = 0, 1, self.target


class NoFp16(CpuAccelerator):
    name = "nofp16"
    supports_fp16 = False


def _runtime(tmp_path: Path, strategy: Any) -> Runtime:
    cfg = resolve(None, [f"logging.run_dir={tmp_path}"], {}, environ={})
    strategy.config = cfg
    strategy.setup_environment()
    return Runtime(cfg, "cpu", strategy, Precision("cpu"), registry=get_registry())


def _lines(err: str, what: str) -> list[str]:
    return [ln for ln in err.splitlines() if what in ln]


def test_a_model_left_on_the_host_is_named_at_the_first_step(tmp_path: Path, capsys) -> None:
    cfg = resolve(None, [], {}, environ={})
    rt = _runtime(tmp_path, OnDevice(cfg))
    model = torch.nn.Linear(3, 1)  # not passed through rt.setup: it stays on the host
    rt.training.modules.append(model)
    for _ in range(3):
        rt.backward(model(torch.ones(2, 3)).sum())  # the script's line
    err = capsys.readouterr().err
    named = _lines(err, "the loss was computed on cpu, but this rank's device is meta")
    assert len(named) == 1, err
    assert named[0].startswith("aios: test_run_names_placement.py:")
    assert "parameter 'weight' is on cpu" in named[0] and "rt.setup" in named[0]


def test_a_model_on_the_device_is_not_named(tmp_path: Path, capsys) -> None:
    cfg = resolve(None, [], {}, environ={})
    st = OnDevice(cfg)
    st.target = torch.device("cpu")
    rt = _runtime(tmp_path, st)
    model = rt.setup(torch.nn.Linear(3, 1))
    rt.backward(model(torch.ones(2, 3)).sum())
    assert "aios:" not in capsys.readouterr().err


def test_float16_on_an_accelerator_without_fp16_speed_is_named(tmp_path: Path, capsys) -> None:
    cfg = resolve(None, [], {}, environ={})
    st = OnDevice(cfg, NoFp16(cfg))
    st.target = torch.device("cpu")
    rt = _runtime(tmp_path, st)
    model = torch.nn.Linear(3, 1).half()
    rt.backward(model(torch.ones(2, 3, dtype=torch.float16)).sum())
    rt.backward(model(torch.ones(2, 3, dtype=torch.float16)).sum())
    named = _lines(capsys.readouterr().err, "the loss is float16, but the nofp16 accelerator")
    assert len(named) == 1 and "precision=bf16-mixed" in named[0]
