"""aios-run's warm start for XLA processes (aios.launcher.warm with the plan's ``preload``): the
zygote imports torch_xla once, with the process's environment, and the process forked from it
trains exactly as a fresh one; an environment that differs in what torch_xla reads at import,
or a zygote whose XLA runtime started, gives a fresh start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytestmark = pytest.mark.xla

SCRIPTS = Path(__file__).parent / "xla_scripts"


def _env(**extra: str) -> dict[str, str]:
    e = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "PJRT_", "XLA_", "TPU_", "CPU_NUM"))
    }
    return {**e, "AIOS_TEST_DMI_PRODUCT": "/nonexistent", **extra}


def _train(tmp_path: Path, name: str, **env: str) -> dict:
    out = tmp_path / f"{name}.json"
    cmd = [
        *python("-c", "from aios.cli.run import main; main()"),
        "--backend",
        "xla",
        "xla.allow_cpu=true",
        f"logging.run_dir={tmp_path / 'runs'}",
        str(SCRIPTS / "xla_train_mlp.py"),
        str(out),
        "--steps",
        "8",
    ]
    p = subprocess.run(
        cmd, capture_output=True, text=True, env=_env(**env), timeout=400, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    return json.loads(out.read_text())


def test_a_warm_xla_cpu_process_trains_exactly_as_a_fresh_one(tmp_path: Path) -> None:
    warm = _train(tmp_path, "warm")
    fresh = _train(tmp_path, "fresh", AIOS_RUN_WARM_START="0")
    assert warm["warm"] is True and fresh["warm"] is False
    assert warm["device"].startswith("xla:") and fresh["device"].startswith("xla:")
    assert warm["losses"] == fresh["losses"]  # bitwise: same floats, same steps
    assert warm["params"] == fresh["params"]


def test_the_zygote_forks_xla_processes_only_with_their_import_time_env(tmp_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(SCRIPTS / "warm_zygote_probe.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=400,
        cwd=tmp_path,
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["preload"] is True
    # CPU_NUM_DEVICES is read when the runtime starts: the process may differ in it
    rank, fresh = report["rank"], report["fresh_rank"]
    assert (rank["warm"], rank["runtime"], rank["devices"]) == (True, False, 2)
    assert fresh["warm"] is False and fresh["devices"] == 2
    # what import torch_xla writes into the environment, as a fresh process has it
    assert rank["env"] == fresh["env"] and rank["env"]["PJRT_DYNAMIC_PLUGINS"] == "1"
    assert report["rank_flags"] is None  # differs in XLA_FLAGS: started fresh by the caller
    assert report["preload_flags"] is False  # XLA_FLAGS is read by import torch_xla
    assert report["rank_after_flags"] is None
    assert report["preload_runtime"] is False  # the XLA runtime started in the zygote
    assert report["after_runtime"] is None


def test_torch_xla_imported_may_fork_a_started_runtime_may_not() -> None:
    code = (
        "import json, os, torch\n"
        "from aios.launcher import warm\n"
        "before = warm.native_threads()\n"
        "import torch_xla, torch_xla.core.xla_model as xm, torch_xla.runtime\n"
        "imported = [warm._safe_to_fork(), warm.native_threads() == before]\n"
        "(torch.ones(2, device=xm.xla_device()) * 2).cpu()\n"
        "print(json.dumps(imported + [warm._safe_to_fork()]))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env(PJRT_DEVICE="CPU", TORCH_DEVICE_BACKEND_AUTOLOAD="0"),
        timeout=400,
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip().splitlines()[-1]) == [True, True, False]
