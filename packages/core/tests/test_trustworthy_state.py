"""Issue 14, "trustworthy state": aios deletes only what it wrote, for its own lineage; one
writer per checkpoint directory; a re-save never loses the good copy; resume says what it
resumes and refuses an incompatible checkpoint; run records never kill training; secrets never
reach run records."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from aios.testing import zygote
from aios.testing.zygote import python

torch = pytest.importorskip("torch")

import aios  # noqa: E402
from aios.checkpoint import MARKER, CheckpointStore  # noqa: E402
from aios.errors import CheckpointError  # noqa: E402
from aios.plugins.registry import reset_registry  # noqa: E402

LOCK_FILE = ".aios-lock"


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


def _state(v: float) -> dict:
    return {"w": torch.full((4,), v), "step": int(v)}


def _data(n: int = 64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return torch.utils.data.TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))


def _train(rt, steps: int, resume: bool = False):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(_data(), batch_size=8, shuffle=True, drop_last=True)
    model, opt, loader = rt.setup(model, opt, loader)
    if resume:
        rt.resume()
    while rt.global_step < steps:
        for x, y in loader:
            rt.backward(torch.nn.functional.mse_loss(model(x), y))
            rt.step(opt)
            if rt.global_step >= steps:
                break
    return model, opt, loader


def _ckpts(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("ckpt-"))


# ------------------------------------------------------------------ 1. keep-N per lineage


def test_keep_n_prunes_only_this_runs_lineage(tmp_path):
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck), "every": 10})
    _train(rt, 10)  # an older run, further along: ckpt-10
    rt.close()
    rt = aios.init(checkpoint={"dir": str(ck), "every": 2, "keep": 1, "resume": False})
    _train(rt, 4)
    rt.close()
    assert _ckpts(ck) == [
        "ckpt-000000004",
        "ckpt-000000010",
    ]  # its own newest kept, the old run's untouched
    rt = aios.init(checkpoint={"dir": str(ck), "keep": 1})
    _train(rt, 0)
    assert rt.resume() == 4  # the run that wrote last, not the higher step of the older run


def test_resumed_run_continues_its_lineage_with_a_relative_dir(tmp_path):
    rt = aios.init(checkpoint={"dir": "ck", "every": 2, "keep": 2})
    _train(rt, 4)
    rt.close()
    rt = aios.init(checkpoint={"dir": "ck", "every": 2, "keep": 2})
    _train(rt, 8, resume=True)
    assert rt.checkpointer.resumed_from == str(tmp_path / "ck" / "ckpt-000000004")
    rt.close()
    assert _ckpts(tmp_path / "ck") == ["ckpt-000000006", "ckpt-000000008"]  # one lineage: keep=2


def test_keep_n_store_level_other_lineage_untouched(tmp_path):
    old = CheckpointStore(str(tmp_path), keep=3)
    old.save(100, _state(100))
    new = CheckpointStore(str(tmp_path), keep=1)
    for s in (1, 2, 3):
        new.save(s, _state(s))
        assert [i.step for i in new.list()] == [s, 100]
    assert new.latest().step == 3  # most recently committed
    assert new.latest(lineage=old.lineage).step == 100


# ------------------------------------------------------------------ 2. one writer per directory

_HOLDER = """
import sys, time, aios
rt = aios.init(checkpoint={"dir": sys.argv[1]})
print("ready", flush=True)
time.sleep(120)
"""


def _holder(tmp_path: Path, ck: Path) -> subprocess.Popen:
    script = tmp_path / "holder.py"
    script.write_text(_HOLDER)
    env = {
        **os.environ,
        "AIOS_RUN_ID": "holder-run",
        "AIOS_LOGGING__RUN_DIR": str(tmp_path / "runs"),
        **zygote.OFF,  # the refusal names its pid
    }
    p = subprocess.Popen(
        [*python(), str(script), str(ck)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert p.stdout.readline().strip() == "ready"
    return p


def test_second_run_on_a_checkpoint_dir_is_refused_in_one_line(tmp_path):
    ck = tmp_path / "ck"
    holder = _holder(tmp_path, ck)
    try:
        script = tmp_path / "second.py"
        script.write_text(
            "import sys, aios\naios.init(checkpoint={'dir': sys.argv[1]})\nprint('started')\n"
        )
        r = subprocess.run(
            [*python(), str(script), str(ck)], capture_output=True, text=True, timeout=300
        )
        assert r.returncode == 2 and "started" not in r.stdout
        err = r.stderr.strip()
        assert "\n" not in err, err
        assert (
            f"checkpoint dir '{ck}' is in use by run holder-run (pid {holder.pid} on {socket.gethostname()}"
            in err
        )
        assert "another checkpoint.dir" in err
        assert (ck / LOCK_FILE).exists()  # the holder's lock is left alone
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the holder died without releasing: its lock is stale (pid gone) and is taken over
    rt = aios.init(checkpoint={"dir": str(ck)})
    assert json.loads((ck / LOCK_FILE).read_text())["pid"] == os.getpid()
    rt.close()
    assert not (ck / LOCK_FILE).exists()


def test_lock_of_another_host_is_stale_only_when_its_heartbeat_is_old(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    lock = {
        "run_id": "elsewhere",
        "pid": 1,
        "host": "other-host.invalid",
        "token": "t",
        "heartbeat": time.time(),
    }
    (ck / LOCK_FILE).write_text(json.dumps(lock))
    with pytest.raises(CheckpointError, match="in use by run elsewhere .*on other-host.invalid"):
        aios.init(checkpoint={"dir": str(ck)})
    lock["heartbeat"] = time.time() - 3600
    (ck / LOCK_FILE).write_text(json.dumps(lock))
    rt = aios.init(checkpoint={"dir": str(ck)})
    assert json.loads((ck / LOCK_FILE).read_text())["run_id"] == rt.record.run_id


def test_prune_of_one_run_never_touches_another_runs_save_in_progress(tmp_path):
    a = CheckpointStore(str(tmp_path), keep=1)
    staging = a.begin(7)  # a's save in progress
    b = CheckpointStore(str(tmp_path), keep=1)
    for s in (1, 2, 3):
        b.save(s, _state(s))
    a.write_file(staging, "state.pt", lambda f: torch.save(_state(7), f))
    a.commit(staging)
    assert [i.step for i in a.list()] == [3, 7]
    assert torch.equal(a.load(a.resolve(7))["w"], torch.full((4,), 7.0))


# ------------------------------------------------------------------ 3. only aios's own temp names


def test_prune_never_deletes_files_aios_did_not_name(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    mine = [
        ".old-notes.txt",
        ".partial-dataset",
        ".old-ckpt-000000001-123",
        ".partial-ckpt-000000001-99",
        ".aios-partial-mine",
    ]
    for n in mine:
        (ck / n).write_text("user data")
    store = CheckpointStore(str(ck), keep=1)
    for s in (1, 2, 3):
        store.save(s, _state(s))
    assert all((ck / n).read_text() == "user data" for n in mine)
    assert _ckpts(ck) == ["ckpt-000000003"]


def test_save_to_an_explicit_path_leaves_the_current_directory_alone(tmp_path):
    (tmp_path / ".old-thing").write_text("keep me")
    (tmp_path / ".partial-thing").mkdir()
    rt = aios.init()
    _train(rt, 2)
    path = rt.save("snapshot")
    assert path == "snapshot" and (tmp_path / "snapshot" / MARKER).exists()
    assert (tmp_path / ".old-thing").read_text() == "keep me" and (
        tmp_path / ".partial-thing"
    ).is_dir()
    assert rt.load(str(tmp_path / "snapshot")) == {}


# ------------------------------------------------------------------ 4. re-save never loses the good copy


@pytest.mark.parametrize("crash_at", [0, 1, 2])
def test_local_resave_crash_at_any_rename_keeps_a_complete_copy(tmp_path, monkeypatch, crash_at):
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(5, _state(1))
    real = os.rename
    calls = {"n": 0}

    def crashing_rename(a, b):
        if calls["n"] == crash_at:
            calls["n"] += 1
            raise OSError(5, "simulated crash")
        calls["n"] += 1
        return real(a, b)

    monkeypatch.setattr(os, "rename", crashing_rename)
    if crash_at < 2:
        with pytest.raises(CheckpointError, match="simulated crash"):
            store.save(5, _state(2))
    else:  # the new copy is complete under its unique name: the save succeeded
        assert store.save(5, _state(2)).startswith(str(tmp_path / "ckpt-000000005-"))
    monkeypatch.setattr(os, "rename", real)
    assert not [
        n for n in os.listdir(tmp_path) if n.startswith(".aios-")
    ]  # nothing half-written left
    fresh = CheckpointStore(str(tmp_path), keep=3)  # what a relaunch sees
    info = fresh.latest()
    assert info is not None and info.step == 5
    assert torch.equal(fresh.load(info)["w"][:1], torch.tensor([1.0])) or torch.equal(
        fresh.load(info)["w"][:1], torch.tensor([2.0])
    )


def test_object_store_resave_failure_keeps_the_old_copy(monkeypatch):
    import fsspec

    store = CheckpointStore("memory://aios-resave/run", keep=3)
    store.save(5, _state(1))
    real_save = torch.save

    def crashing_save(obj, f, *a, **k):
        f.write(b"partial")
        raise RuntimeError("network gone")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(CheckpointError, match="network gone"):
        store.save(5, _state(2))
    monkeypatch.setattr(torch, "save", real_save)
    info = store.latest()
    assert info.step == 5 and torch.equal(store.load(info)["w"], torch.full((4,), 1.0))
    store.save(5, _state(3))  # a successful re-save replaces it: one complete copy of step 5
    copies = [i for i in store.list() if i.step == 5 and i.complete]
    assert len(copies) == 1 and torch.equal(store.load(store.latest())["w"], torch.full((4,), 3.0))
    fsspec.filesystem("memory").rm("/aios-resave", recursive=True)


def test_local_renames_are_followed_by_a_directory_fsync(tmp_path, monkeypatch):
    import stat

    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    CheckpointStore(str(tmp_path / "c"), keep=3).save(1, _state(1))
    assert str(tmp_path / "c") in synced


# ------------------------------------------------------------------ 5. resume is explicit and compatible


def _rewrite_marker(path: Path, **changes) -> None:
    m = json.loads((path / MARKER).read_text())
    m.update(changes)
    (path / MARKER).write_text(json.dumps(m))


def test_resume_says_what_it_resumes(tmp_path, capsys):
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck)})
    _train(rt, 3)
    run_id = rt.record.run_id
    rt.close()
    capsys.readouterr()
    rt = aios.init(checkpoint={"dir": str(ck)})
    _train(rt, 0)
    assert rt.resume() == 3
    out = capsys.readouterr().out
    assert (
        f"aios: resumed from {ck / 'ckpt-000000003'} at step 3 (run {run_id}, world size 1, backend cpu, lineage "
        in out
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"world_size": 2},
            "was written with world size 2, this run has world size 1 and "
            "checkpoint.reshard=false; relaunch with 2 processes",
        ),
        (
            {"backend": "cuda"},
            "was written by backend 'cuda', this run uses 'cpu' and checkpoint.reshard=false",
        ),
        (
            {"strategy": "FSDPStrategy"},
            "was written by strategy FSDPStrategy, this run uses DDPStrategy and "
            "checkpoint.reshard=false",
        ),
    ],
)
def test_resume_at_another_shape_is_refused_with_reshard_false(tmp_path, change, message):
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck)})
    _train(rt, 3)
    rt.close()
    _rewrite_marker(ck / "ckpt-000000003", **change)  # as a run with that setup writes it
    rt = aios.init(checkpoint={"dir": str(ck), "reshard": False})
    model, _, _ = _train(rt, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as ei:
        rt.resume()
    assert (
        message in str(ei.value)
        and "\n" not in str(ei.value)
        and "checkpoint.resume=false" in str(ei.value)
        and "checkpoint.reshard=true" in str(ei.value)
    )
    assert rt.global_step == 0 and all(
        torch.equal(before[k], v) for k, v in model.state_dict().items()
    )


def test_a_full_checkpoint_of_another_world_size_resumes_by_default_and_says_so(tmp_path, capsys):
    """Issue 26: the default resumes at another shape (a 'full' checkpoint loads everywhere)
    and one line says what changed."""
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck)})
    _train(rt, 3)
    rt.close()
    # as 4 processes with batches of 8 write it: 32 samples per step
    _rewrite_marker(ck / "ckpt-000000003", world_size=4, data_world=4, global_batch=32)
    capsys.readouterr()
    rt = aios.init(checkpoint={"dir": str(ck)})
    _train(rt, 0)
    assert rt.resume() == 3
    out = capsys.readouterr().out
    assert (
        "aios: resumed at step 3: 4 -> 1 process, the global batch is now 8, was 32 (micro-batch "
        "8 x 1 data-parallel ranks x grad_accum 1); set global_batch and micro_batch to keep it"
        in out
    ), out
    with pytest.raises(CheckpointError, match="checkpoint.reshard=false"):
        rt.resume(reshard=False)


# ------------------------------------------------------------------ 10. run records never kill training


@pytest.mark.parametrize("kind", ["file", "too-long"])
def test_unwritable_run_dir_warns_once_and_training_goes_on(tmp_path, monkeypatch, kind):
    if kind == "file":
        bad = tmp_path / "runs-file"
        bad.write_text("not a directory")
    else:
        bad = tmp_path / ("x" * 300)
    monkeypatch.setenv("AIOS_LOGGING__RUN_DIR", str(bad))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt = aios.init(checkpoint={"dir": str(tmp_path / "ck"), "every": 2})
        _train(rt, 4)
        rt.log({"loss": 1.0})
        rt.close()
    msgs = [str(w.message) for w in caught if "run record" in str(w.message)]
    assert len(msgs) == 1 and "training continues" in msgs[0]
    assert _ckpts(tmp_path / "ck") == ["ckpt-000000002", "ckpt-000000004"]


def test_disk_full_on_diagnostics_leaves_no_temp_file(tmp_path, monkeypatch):
    rt = aios.init()
    real = os.replace

    def full(a, b):
        if "diagnostics.json" in str(b):
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr(os, "replace", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(rt, 2)
        rt.save(str(tmp_path / "snap"))  # rewrites diagnostics
        rt.close()
    assert len([w for w in caught if "No space left" in str(w.message)]) == 1
    assert not [p for p in Path(rt.run_dir).iterdir() if ".tmp-" in p.name]


# ------------------------------------------------------------------ 15. secrets


def test_argv_secrets_are_redacted_in_run_records(tmp_path, monkeypatch):
    argv = [
        "train.py",
        "--token=tok-111",
        "--api-key",
        "key-222",
        "HF_TOKEN=hf-333",
        "db.password=pw-444",
        "--db",
        "postgres://me:pw-555@db.example/x",
        "--lr",
        "0.1",
        "monkey_name=bob",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    rt = aios.init()
    rt.close()
    text = (Path(rt.run_dir) / "diagnostics.json").read_text()
    for secret in ("tok-111", "key-222", "hf-333", "pw-444", "pw-555"):
        assert secret not in text
    recorded = json.loads(text)["argv"]
    assert recorded == [
        "train.py",
        "--token=***",
        "--api-key",
        "***",
        "HF_TOKEN=***",
        "db.password=***",
        "--db",
        "postgres://me:***@db.example/x",
        "--lr",
        "0.1",
        "monkey_name=bob",
    ]


@pytest.mark.parametrize(
    "name",
    [
        "DB_PASS",
        "GITHUB_PAT",
        "DATABASE_URL",
        "COOKIE",
        "SESSION",
        "AUTH_HEADER",
        "WANDB_API_KEY",
        "apiKey",
        "aws_secret_access_key",
        "HF_TOKEN",
        "REDIS_URL",
        "PGPASSWORD",
    ],
)
def test_secret_names(name):
    from aios.config.schema import is_secret

    assert is_secret(name)


@pytest.mark.parametrize(
    "name", ["MONKEY_NAME", "tokenizer", "PWD", "PATH", "keep", "checkpoint_dir", "url", "PATIENCE"]
)
def test_not_secret_names(name):
    from aios.config.schema import is_secret

    assert not is_secret(name)


def test_worker_config_and_records_drop_new_secret_names(tmp_path, monkeypatch):
    from aios.config.schema import redact

    assert redact({"DB_PASS": "x", "MONKEY_NAME": "bob", "dir": "s3://u:pw@h/b"}) == {
        "DB_PASS": "***",
        "MONKEY_NAME": "bob",
        "dir": "s3://u:***@h/b",
    }


def test_object_store_lock_refuses_a_live_holder_and_takes_over_a_stale_one():
    import fsspec

    store = CheckpointStore("memory://aios-lock-test/ck", keep=1)
    fs = fsspec.filesystem("memory")
    fs.makedirs("/aios-lock-test/ck", exist_ok=True)
    lock = {
        "run_id": "remote",
        "pid": 7,
        "host": "other-host.invalid",
        "token": "t",
        "heartbeat": time.time(),
    }
    fs.pipe("/aios-lock-test/ck/.aios-lock", json.dumps(lock).encode())
    with pytest.raises(
        CheckpointError, match="memory://aios-lock-test/ck' is in use by run remote"
    ):
        store.acquire_lock({"run_id": "me"})
    lock["heartbeat"] = time.time() - 3600
    fs.pipe("/aios-lock-test/ck/.aios-lock", json.dumps(lock).encode())
    store.acquire_lock({"run_id": "me"})
    assert store.read_lock()["run_id"] == "me"
    store.release_lock()
    assert store.read_lock() is None
    fs.rm("/aios-lock-test", recursive=True)


def test_lock_heartbeat_keeps_a_long_run_fresh(tmp_path, monkeypatch):
    import aios.checkpoint.lock as lockmod

    monkeypatch.setattr(lockmod, "LOCK_HEARTBEAT_S", 0.05)
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck)})
    first = json.loads((ck / LOCK_FILE).read_text())["heartbeat"]
    deadline = time.time() + 30
    while json.loads((ck / LOCK_FILE).read_text())["heartbeat"] == first and time.time() < deadline:
        time.sleep(0.05)
    assert json.loads((ck / LOCK_FILE).read_text())["heartbeat"] > first
    assert not [p for p in ck.iterdir() if p.name.startswith(".aios-lock.")]  # no temp files left
    rt.close()
    assert not (ck / LOCK_FILE).exists()


def test_save_to_an_explicit_path_inside_checkpoint_dir_keeps_the_periodic_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    rt = aios.init(checkpoint={"dir": str(ck), "every": 2})
    _train(rt, 3)  # ckpt-2 written at the boundary
    rt.save(str(ck / "ckpt-000000002-copy-dir-not-ckpt"))  # an odd name that is not aios's
    rt.training.step = 2
    path = rt.save(str(ck / "best"))
    assert path == str(ck / "best") and (ck / "best" / MARKER).exists()
    assert (
        ck / "ckpt-000000002" / MARKER
    ).exists()  # the periodic checkpoint of that step is intact
    with pytest.raises(CheckpointError, match="already exists"):
        rt.save(str(ck / "best"))
    assert (ck / "best" / MARKER).exists()
    assert not [p for p in ck.iterdir() if p.name.startswith(".aios-partial")]
