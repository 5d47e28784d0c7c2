"""A save on a full disk fails with one aios line naming the cause as the OS gave it ("No space
left on device"), not torch's zip-writer message (``unexpected pos ...``) or DCP's traceback;
nothing half-written is left and the last good checkpoint is kept. A real small tmpfs (root)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest
from aios.testing.zygote import python

torch = pytest.importorskip("torch")


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 512 KiB tmpfs (needs root and mount; skipped with the reason otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_format_save_on_a_full_disk_names_the_os_cause(small_fs: Path) -> None:
    from aios.checkpoint import CheckpointStore
    from aios.errors import CheckpointError

    store = CheckpointStore(str(small_fs / "ck"), keep=2)
    store.save(1, {"w": torch.zeros(1000)})
    with pytest.raises(CheckpointError) as ei:
        store.save(2, {"w": torch.zeros(400_000)})  # 1.6 MB on 512 KiB
    msg = str(ei.value)
    assert "No space left on device [ENOSPC]" in msg and "\n" not in msg, msg
    assert "unexpected pos" not in msg
    assert sorted(os.listdir(small_fs / "ck")) == ["ckpt-000000001"]
    assert store.latest().step == 1


def test_dcp_save_on_a_full_disk_names_the_os_cause(small_fs: Path) -> None:
    from aios.checkpoint.formats import dcp as adcp
    from aios.errors import CheckpointError

    big = torch.nn.Linear(400, 400)  # 640 KB of weights
    for background in (False, True):
        ck = adcp.DcpCheckpointer(str(small_fs / f"dcp{background}"), async_mode="thread")
        with pytest.raises(CheckpointError) as ei:
            ck.save(1, [big], [], {"step": 1}, {"rng": adcp.rng_state()}, async_save=background)
            ck.wait()
        msg = str(ei.value)
        assert "No space left on device [ENOSPC]" in msg and "\n" not in msg, msg
        with contextlib.suppress(Exception):
            ck.wait()
        assert ck.store.latest(warn=False) is None


def test_a_failed_background_sharded_save_is_one_line_without_dcp_fragments(
    small_fs: Path, tmp_path: Path
) -> None:
    """2 ranks, fsdp (dcp, background saves written by DCP's checkpoint process) on a disk too
    small for the shards: aios's one line, none of DCP's per-rank traceback fragments."""

    from aios.testing.strategy_contract import free_port

    script = Path(__file__).parent / "scripts" / "bg_save_full.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update(
        AIOS_LOGGING__TENSORBOARD="false",
        AIOS_LOGGING__RUN_DIR=str(tmp_path / "runs"),
        OMP_NUM_THREADS="1",
    )
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()"), "--nprocs", "2"]
        + [f"master_port={free_port()}", "strategy=fsdp", f"checkpoint.dir={small_fs / 'ck'}"]
        + ["checkpoint.async_writer=process", str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "No space left on device [ENOSPC]" in out, out
    assert "(RANK " not in out and "Errno 28" not in out and "Traceback" not in out, out
