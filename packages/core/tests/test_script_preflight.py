"""Say what is wrong before it costs anything (real aios-run subprocesses, gloo, 2 processes):
copies that never join one process group are named; a script's own world-1 group is refused at
aios.init; aios-run's key=value options after the script are pointed out; save_best / rt.save()
without checkpoint.dir are refused before the run starts (and at rt.setup without aios-run)."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from aios.testing.launch import AIOS_RUN
from aios.testing.zygote import python

pytest.importorskip("torch")


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def _script(tmp: Path, source: str, name: str = "train.py") -> Path:
    path = tmp / name
    path.write_text(textwrap.dedent(source))
    return path


def _aios_run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AIOS_RUN, *args], env=_env(tmp), capture_output=True, text=True, timeout=240, cwd=tmp
    )


# a script that reads its own --world-size (default 1), as pytorch/examples' imagenet does
OWN_WORLD = """
    import argparse
    import torch.distributed as dist
    p = argparse.ArgumentParser()
    p.add_argument("--world-size", type=int, default=1)
    args = p.parse_args()
    if args.world_size > 1:
        dist.init_process_group("gloo")
    open(f"model-{__import__('os').getpid()}.pt", "w").write("x")  # every copy writes
"""

GPU_GATE = """
    import sys
    import torch
    if torch.cuda.device_count() < 4:
        print("Unable to locate sufficient 4 gpus to run this example. Exiting.")
        sys.exit()
"""


@pytest.mark.parametrize("source", [OWN_WORLD, GPU_GATE], ids=["own-world-size", "gpu-gate"])
def test_copies_that_never_join_are_named(tmp_path: Path, free_port, source: str) -> None:
    script = _script(tmp_path, source)
    p = _aios_run(tmp_path, "--nprocs", "2", "--master-port", str(free_port()), str(script))
    lines = [ln for ln in p.stderr.splitlines() if "without calling aios.init()" in ln]
    assert len(lines) == 1, p.stdout + p.stderr
    assert "ranks 0, 1 of 2" in lines[0] and "2 independent copies" in lines[0]


def test_an_aios_script_that_joins_is_not_named(tmp_path: Path, free_port) -> None:
    script = _script(
        tmp_path,
        """
        import aios
        rt = aios.init()
        rt.barrier()
        rt.close()
        """,
    )
    p = _aios_run(tmp_path, "--nprocs", "2", "--master-port", str(free_port()), str(script))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "without calling aios.init()" not in p.stderr


def test_a_plain_torchrun_script_that_joins_is_not_named(tmp_path: Path, free_port) -> None:
    """A script written for torchrun (no aios.init()) whose ranks join the launcher's group is
    no copy: the ranks counted by torch's init barrier in the launcher's store say so."""
    script = _script(
        tmp_path,
        """
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(1)
        dist.all_reduce(t)
        assert t.item() == dist.get_world_size() == 2
        dist.destroy_process_group()
        """,
    )
    p = _aios_run(tmp_path, "--nprocs", "2", "--master-port", str(free_port()), str(script))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "without calling aios.init()" not in p.stderr, p.stderr


def test_a_scripts_own_world_of_one_is_refused_at_init(tmp_path: Path, free_port) -> None:
    script = _script(
        tmp_path,
        """
        import aios
        import torch.distributed as dist
        # its own group of one (a --world-size 1 of its own): nothing shared with the other copy
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        rt = aios.init()
        print("trained alone")
        """,
    )
    p = _aios_run(tmp_path, "--nprocs", "2", "--master-port", str(free_port()), str(script))
    out = p.stdout + p.stderr
    assert p.returncode == 2, out
    assert "trained alone" not in out
    assert "rank 0 of 1, but the launcher started this process as rank" in out
    assert "Traceback" not in out


def test_aios_options_after_the_script_are_pointed_out(tmp_path: Path) -> None:
    script = _script(tmp_path, "import sys; print('args', sys.argv[1:])\n")
    p = _aios_run(tmp_path, str(script), "strategy=fsdp", "lr=3")
    assert p.returncode == 0, p.stderr
    notes = [ln for ln in p.stderr.splitlines() if "strategy=fsdp" in ln]
    assert len(notes) == 1, p.stderr
    assert "go" in notes[0] and "before the script" in notes[0] and "lr=3" not in notes[0]
    assert "args ['strategy=fsdp', 'lr=3']" in p.stdout  # the script still gets them


SAVES_BEST = """
    import aios
    import torch
    rt = aios.init()
    model, opt = rt.setup(torch.nn.Linear(2, 1), torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
    open("started", "w").write("1")
    for epoch in range(2):
        rt.save_best(1.0 / (epoch + 1))
"""


def test_save_best_without_checkpoint_dir_is_refused_before_the_run(tmp_path: Path) -> None:
    script = _script(tmp_path, SAVES_BEST)
    p = _aios_run(tmp_path, "--nprocs", "2", str(script))
    assert p.returncode == 2, p.stdout + p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "train.py:8 calls rt.save_best()" in err[0], p.stderr
    assert "checkpoint.dir" in err[0]
    assert not (tmp_path / "started").exists()
    p = _aios_run(tmp_path, f"checkpoint.dir={tmp_path / 'ckpt'}", str(script))
    assert p.returncode == 0, p.stderr


def test_save_without_checkpoint_dir_is_refused_at_setup_without_aios_run(tmp_path: Path) -> None:
    script = _script(tmp_path, SAVES_BEST.replace("rt.save_best(1.0 / (epoch + 1))", "rt.save()"))
    p = subprocess.run(
        [*python(), str(script)],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "train.py:8 calls rt.save()" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "started").exists()


@pytest.mark.parametrize(
    "init",
    [
        "aios.init(checkpoint={'dir': 'ck'})",
        "aios.init(defaults={'checkpoint': {'dir': 'ck'}})",
        "aios.init(overrides=['checkpoint.dir=ck'])",
        "aios.init({'checkpoint': {'dir': 'ck'}})",
    ],
)
def test_a_script_that_sets_its_own_checkpoint_dir_is_trusted(init: str) -> None:
    """Settings the script passes to aios.init may set checkpoint.dir: no refusal before the run
    (aios.init's section keywords included, as tests/scripts/sharded_format.py writes them)."""
    from aios.resilience.preflight import needs_checkpoint_dir

    src = f"import aios\nrt = {init}\nrt.save()\n"
    assert needs_checkpoint_dir(src) is None
    assert needs_checkpoint_dir("import aios\nrt = aios.init()\nrt.save()\n") == (3, "rt.save()")


def test_a_save_behind_a_switch_set_at_launch_is_not_refused() -> None:
    """``STOP_AFTER=3 aios-run checkpoint.dir=ck train.py`` saves; the same script run without
    the switch never does and must not be refused (backend-cuda's DeepSpeed script is such)."""
    from aios.resilience.preflight import needs_checkpoint_dir

    head = "import aios, os, sys\nrt = aios.init()\n"
    for switch in (
        'stop_after = int(os.environ.get("STOP_AFTER", "0"))',
        'stop_after = os.getenv("STOP_AFTER")',
        "stop_after = len(sys.argv) > 2",
    ):
        src = (
            head
            + switch
            + "\nfor i in range(9):\n    if stop_after and i > 2:\n        rt.save()\n"
        )
        assert needs_checkpoint_dir(src) is None, switch
    # a condition on the loop alone still saves on every run: refused
    src = head + "for i in range(9):\n    if i % 3 == 0:\n        rt.save()\n"
    assert needs_checkpoint_dir(src) == (5, "rt.save()")
