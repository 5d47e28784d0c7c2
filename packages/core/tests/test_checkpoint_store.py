"""CheckpointStore: atomic saves, keep-N, newest complete for resume, partial skipped with a
line, corrupt is a one-line error, a crash mid-save never damages the last good checkpoint."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from aios.checkpoint import DIGEST, MARKER, STATE_FILE, CheckpointStore  # noqa: E402
from aios.errors import CheckpointError  # noqa: E402
from aios.plugins.registry import reset_registry  # noqa: E402


@pytest.fixture(autouse=True)
def _registry():
    reset_registry()
    yield
    reset_registry()


def _state(v: float) -> dict:
    return {"w": torch.full((4,), v), "step": int(v)}


def test_checkpoint_save_layout_and_marker(tmp_path):
    store = CheckpointStore(str(tmp_path / "c"), keep=3)
    path = store.save(7, _state(7.0), {"run_id": "r"})
    assert path == str(tmp_path / "c" / "ckpt-000000007")
    marker = json.loads((Path(path) / MARKER).read_text())
    assert marker["step"] == 7 and marker["run_id"] == "r"
    assert marker["files"][STATE_FILE]["size"] == (Path(path) / STATE_FILE).stat().st_size
    assert sorted(os.listdir(tmp_path / "c")) == ["ckpt-000000007"]  # no temp dirs left
    info = store.latest()
    assert info.step == 7 and torch.equal(store.load(info)["w"], torch.full((4,), 7.0))


def test_checkpoint_keep_n_deletes_oldest(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=2)
    for s in (1, 2, 3, 4):
        store.save(s, _state(s))
    assert [i.step for i in store.list()] == [3, 4]


def test_checkpoint_partial_is_skipped_with_one_aios_line(tmp_path, capsys):
    store = CheckpointStore(str(tmp_path), keep=5)
    store.save(1, _state(1))
    partial = tmp_path / "ckpt-000000002"
    partial.mkdir()
    (partial / STATE_FILE).write_bytes(b"half a file")  # no marker, and nothing says who wrote it
    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # aios's line, never a Python warning
        info = store.latest(say=said.append)
    assert info.step == 1
    assert len(said) == 1 and said[0].startswith("aios: skipping incomplete checkpoint ")
    assert "ckpt-000000002" in said[0]
    store.latest()  # nobody to say it to: one line on stderr, no source path in front
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("aios: skipping incomplete checkpoint "), err
    store.save(3, _state(3))
    # not attributable to this store's lineage: never deleted (aios deletes only what it wrote)
    assert [i.step for i in store.list()] == [1, 2, 3]
    assert (partial / STATE_FILE).read_bytes() == b"half a file"


def test_checkpoint_own_interrupted_save_is_cleaned_up():
    import fsspec

    store = CheckpointStore("memory://aios-ck-partial/run", keep=5)
    store.save(1, _state(1))
    staging = store.begin(2)  # an interrupted in-place save of this lineage (object store)
    with store.open_write(f"{staging.path}/{STATE_FILE}") as f:
        f.write(b"half a file")
    said: list[str] = []
    assert store.latest(say=said.append).step == 1
    assert len(said) == 1 and "skipping incomplete checkpoint" in said[0]
    assert "ckpt-000000002" in said[0]
    store.save(3, _state(3))
    assert [i.step for i in store.list()] == [1, 3]  # the leftover was ours: cleaned up
    fsspec.filesystem("memory").rm("/aios-ck-partial", recursive=True)


def test_checkpoint_corrupt_state_is_one_line_error(tmp_path):
    store = CheckpointStore(str(tmp_path))
    path = Path(store.save(1, _state(1)))
    data = bytearray((path / STATE_FILE).read_bytes())
    data[len(data) // 2] ^= 0xFF  # bit rot, same size
    (path / STATE_FILE).write_bytes(bytes(data))
    info = store.latest()
    store.verify(info)  # sizes still match
    with pytest.raises(CheckpointError) as ei:
        store.load(info)
    msg = str(ei.value)
    assert (
        "corrupt" in msg and DIGEST in msg and "\n" not in msg and "checkpoint.resume=false" in msg
    )


def test_checkpoint_truncated_file_fails_verify(tmp_path):
    store = CheckpointStore(str(tmp_path))
    path = Path(store.save(1, _state(1)))
    (path / STATE_FILE).write_bytes(b"x")
    with pytest.raises(CheckpointError, match="has 1 bytes"):
        store.verify(store.latest())


def test_checkpoint_unreadable_marker_is_error(tmp_path):
    store = CheckpointStore(str(tmp_path))
    path = Path(store.save(1, _state(1)))
    (path / MARKER).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable marker"):
        store.latest()


def test_checkpoint_crash_mid_save_keeps_last_good(tmp_path, monkeypatch):
    store = CheckpointStore(str(tmp_path), keep=1)
    store.save(1, _state(1))

    class Boom(RuntimeError):
        pass

    real_save = torch.save

    def crashing_save(obj, f, *a, **k):
        f.write(b"partial bytes")
        raise Boom("disk vanished")

    monkeypatch.setattr(torch, "save", crashing_save)
    with pytest.raises(CheckpointError, match="saving checkpoint .* failed .*disk vanished"):
        store.save(2, _state(2))
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000001"]  # nothing half-written left
    info = store.latest()
    assert info.step == 1 and torch.equal(store.load(info)["w"], torch.full((4,), 1.0))


def test_checkpoint_resave_same_step_replaces_atomically(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(5, _state(1))
    store.save(5, _state(2))
    info = store.latest()
    assert torch.equal(store.load(info)["w"], torch.full((4,), 2.0))
    assert sorted(os.listdir(tmp_path)) == ["ckpt-000000005"]


def test_checkpoint_unregistered_scheme_names_install(tmp_path):
    with pytest.raises(CheckpointError, match=r"'nosuch://' is not registered"):
        CheckpointStore("nosuch://bucket/x")


def test_checkpoint_unwritable_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    store = CheckpointStore(str(blocker / "sub"))
    with pytest.raises(CheckpointError, match="not writable"):
        store.check_writable()


def test_checkpoint_memory_url_marker_written_last(monkeypatch):
    import fsspec

    store = CheckpointStore("memory://aios-ck-test/run", keep=2)
    order: list[str] = []
    real_open = store.fs.open

    def spy(path, mode="rb", *a, **k):
        if "w" in mode:
            order.append(path.rsplit("/", 1)[-1])
        return real_open(path, mode, *a, **k)

    monkeypatch.setattr(store.fs, "open", spy)
    path = store.save(3, _state(3))
    assert path == "memory://aios-ck-test/run/ckpt-000000003"
    assert [n for n in order if not n.startswith(".aios")] == [STATE_FILE, MARKER]
    assert store.latest().step == 3
    fsspec.filesystem("memory").rm("/aios-ck-test", recursive=True)


def test_a_flipped_byte_in_state_pt_is_refused_while_it_is_read_once(tmp_path):
    """The full format's load reads the file from the disk once (one hashing pass, then torch
    maps the cached pages): a byte flipped after the save (same size) is a one-line "corrupt"
    error naming the file, and nothing of the damaged state is returned."""
    import torch
    from aios.checkpoint import STATE_FILE, CheckpointStore
    from aios.errors import CheckpointError

    store = CheckpointStore(str(tmp_path / "ck"), keep=2)
    store.save(1, {"w": torch.arange(10_000, dtype=torch.float32)})
    info = store.latest()
    assert torch.equal(store.load(info)["w"], torch.arange(10_000, dtype=torch.float32))
    f = tmp_path / "ck" / info.path.rsplit("/", 1)[1] / STATE_FILE
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the tensor data: torch alone would load it
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=f"{STATE_FILE} does not match the {DIGEST}"):
        store.load(store.latest())


def _flip_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, inside the tensor data, same size
    path.write_bytes(bytes(data))


def test_a_damaged_state_pt_is_never_unpickled(tmp_path, monkeypatch):
    """The digest is checked over the whole file before torch sees any of it: a damaged
    file never reaches ``torch.load`` (nothing unpickled), a sound one is loaded once."""
    store = CheckpointStore(str(tmp_path / "ck"))
    path = Path(store.save(1, {"w": torch.arange(100_000, dtype=torch.float32)}))
    calls: list[object] = []
    real = torch.load

    def spy(f, *a, **k):
        calls.append(f)
        return real(f, *a, **k)

    monkeypatch.setattr(torch, "load", spy)
    assert torch.equal(store.load(store.latest())["w"], torch.arange(100_000, dtype=torch.float32))
    assert len(calls) == 1
    _flip_middle(path / STATE_FILE)
    calls.clear()
    with pytest.raises(CheckpointError, match=f"{STATE_FILE} does not match the {DIGEST}"):
        store.load(store.latest())
    assert calls == []


def test_state_pt_keeps_no_zip_crc_and_loads_with_plain_torch(tmp_path):
    """The marker's digest covers every byte of state.pt, so torch's per-record CRC-32 (a
    second pass over every byte) is not computed; plain ``torch.load`` still reads the file."""
    import zipfile

    store = CheckpointStore(str(tmp_path / "ck"))
    path = Path(store.save(1, {"w": torch.arange(1000, dtype=torch.float32)}))
    marker = json.loads((path / MARKER).read_text())
    assert marker["files"][STATE_FILE][DIGEST] and marker["files"][STATE_FILE]["size"] > 4000
    with zipfile.ZipFile(path / STATE_FILE) as z:
        assert {i.CRC for i in z.infolist() if i.file_size} == {0}
    plain = torch.load(path / STATE_FILE, weights_only=True)
    assert torch.equal(plain["w"], torch.arange(1000, dtype=torch.float32))
    assert torch.serialization.get_crc32_options()  # torch's own setting is left as it was


def test_checkpoints_with_sha256_digests_are_still_checked(tmp_path):
    """A checkpoint written by an earlier version records sha256: it loads, and a damaged one
    is refused naming sha256."""
    import hashlib

    store = CheckpointStore(str(tmp_path / "ck"))
    path = Path(store.save(1, _state(1)))
    marker = json.loads((path / MARKER).read_text())
    entry = marker["files"][STATE_FILE]
    entry.pop(DIGEST)
    entry["sha256"] = hashlib.sha256((path / STATE_FILE).read_bytes()).hexdigest()
    (path / MARKER).write_text(json.dumps(marker))
    assert torch.equal(store.load(store.latest())["w"], torch.full((4,), 1.0))
    _flip_middle(path / STATE_FILE)
    with pytest.raises(CheckpointError, match=f"{STATE_FILE} does not match the sha256"):
        store.load(store.latest())


def _mapped(path: Path) -> bool:
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(real) for line in f)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_resume_keeps_no_tensor_backed_by_the_checkpoint_file(tmp_path):
    """``store.load`` maps state.pt (no copy out of the page cache); the full format copies the
    weights into the model and gives the optimizer's moments memory of their own, so once the
    state is restored nothing holds the file: pruning it frees its disk space."""
    import gc

    from aios.checkpoint.formats.full import FullStateFormat

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, 64)).sum().backward()
    opt.step()
    saved = {
        "modules": [model.state_dict()],
        "optimizers": [opt.state_dict()],
        "extra": {"ema": torch.ones(64)},
    }
    store = CheckpointStore(str(tmp_path / "ck"))
    path = Path(store.save(1, saved)) / STATE_FILE

    state = store.load(store.latest())
    assert _mapped(path)  # the load itself maps the file: nothing is copied
    del state
    gc.collect()
    assert not _mapped(path)

    model2 = torch.nn.Linear(64, 64)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1e-3)

    class Target:
        def load_state_dict(self, state, strict=True, rank=0):
            model2.load_state_dict(state["modules"][0])
            opt2.load_state_dict(state["optimizers"][0])

    extra = FullStateFormat().load(store.latest(), store, Target())
    gc.collect()
    assert not _mapped(path), "a restored tensor still maps the checkpoint file"
    assert torch.equal(extra["ema"], torch.ones(64))
    assert torch.equal(model2.weight, model.weight)
    for p, p2 in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], opt2.state[p2]["exp_avg"])
    model2(torch.randn(8, 64)).sum().backward()
    opt2.step()  # the restored moments are ordinary writable memory
