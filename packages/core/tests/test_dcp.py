"""The ``dcp`` checkpoint format (aios.checkpoint.formats.dcp) with hand-written FSDP2 over real gloo processes:
save on 4 ranks and resume on 4 (bitwise), 2 and 1 (resharded, loss continues); async save
overlapping training; a rank dying before the commit leaves a checkpoint that is never resumed;
the same through gs:// (gcp-storage-emulator), s3:// (moto) and memory://."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aios.testing.zygote import python

torch = pytest.importorskip("torch")

WORKER = Path(__file__).parent / "scripts" / "dcp_worker.py"
STEPS = 6
SAVE_AT = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    world: int, job: dict[str, Any], env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[list[int], str]:
    """Start ``world`` ranks of the worker; when one fails, stop the others (as torchrun does).
    Returns the exit codes and the output."""
    port = _free_port()
    procs = []
    log = Path(job["out"]) / "log.txt"
    Path(job["out"]).mkdir(parents=True, exist_ok=True)
    out = open(log, "w")
    base = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    for r in range(world):
        e = {
            **base,
            **(env or {}),
            "RANK": str(r),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(r),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [*python(), str(WORKER), json.dumps(job)],
                env=e,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    end = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > end:
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
            time.sleep(0.05)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        out.close()
    return [p.returncode for p in procs], log.read_text()


def _result(out: Path, rank: int = 0) -> dict[str, Any]:
    return json.loads((out / f"rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The uninterrupted 4-rank run: async save after step 3 (each rank's shard write held
    until the following training step has finished), trained to step 6."""
    tmp = tmp_path_factory.mktemp("dcp-ref")
    job = {
        "ckpt": str(tmp / "ckpt"),
        "steps": STEPS,
        "save_at": [SAVE_AT],
        "async": True,
        "gate": "overlap",
        "out": str(tmp / "out"),
    }
    codes, log = _launch(4, job)
    assert codes == [0, 0, 0, 0], log
    return {"ckpt": tmp / "ckpt", "ranks": [_result(tmp / "out", r) for r in range(4)]}


def test_dcp_async_save_overlaps_training(reference: dict[str, Any]) -> None:
    from aios.checkpoint import CheckpointStore

    for res in reference["ranks"]:
        ov = res["overlap"]
        # the step after the save ran to completion while this rank's shard write was held
        assert ov["in_flight_after_next_step"] is True and ov["gate_timed_out"] is False, ov
        # written by DCP's checkpoint process (async_mode="process"), not the training process
        assert ov["writer_pid"] != ov["rank_pid"], ov
    info = CheckpointStore(str(reference["ckpt"])).latest()
    assert (
        info is not None
        and info.step == SAVE_AT
        and info.meta["checkpoint_format"] == "dcp"
        and info.meta["world_size"] == 4
    )
    names = set(info.meta["files"])
    assert (
        {f"rank-{r:05d}.pt" for r in range(4)} <= names
        and ".metadata" in names
        and "common.pt" in names
    )
    assert sum(n.endswith(".distcp") for n in names) == 4  # every rank wrote its own shards


@pytest.mark.parametrize("world", [4, 2, 1])
def test_dcp_fsdp_resume_on_other_world_sizes(
    reference: dict[str, Any], tmp_path: Path, world: int
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference["ckpt"], ckpt)
    job = {"ckpt": str(ckpt), "steps": STEPS, "resume": True, "out": str(tmp_path / "out")}
    codes, log = _launch(world, job)
    assert codes == [0] * world, log
    assert f"resumed from step {SAVE_AT}: saved by 4 ranks, loaded on {world} ranks" in log
    ref = reference["ranks"][0]["losses"]
    got = _result(tmp_path / "out")["losses"]
    assert sorted(got, key=int) == [str(s) for s in range(SAVE_AT + 1, STEPS + 1)]
    for s, loss in got.items():
        if world == 4:
            assert loss == ref[s], (s, loss, ref[s])  # same world size: bitwise
        else:
            assert loss == pytest.approx(ref[s], rel=1e-5, abs=1e-7), (s, loss, ref[s])
    # ranks that existed at save time continue their own RNG streams exactly
    for r in range(world):
        draws = _result(tmp_path / "out", r)["draws"]
        for s, d in draws.items():
            assert d == reference["ranks"][r]["draws"][s]


def test_dcp_rank_dying_before_commit_is_never_resumed(tmp_path: Path) -> None:
    from aios.checkpoint import CheckpointStore

    ckpt = tmp_path / "ckpt"
    job = {
        "ckpt": str(ckpt),
        "steps": 4,
        "save_at": [2, 4],
        "gate": "die",
        "die_at": 4,
        "out": str(tmp_path / "out"),
    }
    codes, log = _launch(2, job)
    assert codes[1] == 9 and codes[0] != 0, (codes, log)
    assert (tmp_path / "out" / "dying").exists()
    # step 4 was staged but never committed: its staging directory has no marker (or rank 0,
    # seeing the save fail, removed it before it was stopped)
    for partial in ckpt.glob(".aios-partial-ckpt-000000004-*"):
        assert not (partial / "aios-checkpoint.json").exists()
    assert not (ckpt / "ckpt-000000004").exists()
    store = CheckpointStore(str(ckpt))
    assert [(c.step, c.complete) for c in store.list()] == [(2, True)]
    assert store.latest().step == 2
    codes, log = _launch(
        1, {"ckpt": str(ckpt), "steps": 3, "resume": True, "out": str(tmp_path / "out1")}
    )
    assert codes == [0], log
    assert "resumed from step 2: saved by 2 ranks, loaded on 1 ranks" in log


# ------------------------------------------------------------------------------ pure functions


def test_dcp_unknown_async_mode_is_a_one_line_error() -> None:
    from aios.checkpoint.formats.dcp import DcpWriter
    from aios.errors import CheckpointError

    with pytest.raises(CheckpointError) as exc:
        DcpWriter(async_mode="fork")
    assert exc.value.one_line() == (
        "unknown async checkpoint mode 'fork'; choose one of: process, thread"
    )


def test_dcp_loader_position_rederived_from_global_samples() -> None:
    from aios.data.loaders import reshard_loader_state

    st = {"epoch": 1, "batch": 6, "batch_size": 4}
    assert reshard_loader_state(st, 4, 4) is st
    assert reshard_loader_state(st, 4, 2, 4, 8)["batch"] == 6  # same global batch: same step
    assert reshard_loader_state(st, 4, 2, 4, 4)["batch"] == 12  # 96 samples / (4 x 2)
    assert reshard_loader_state(st, 4, 8, 4, 4)["batch"] == 3
    with pytest.warns(UserWarning, match="seen twice"):
        assert (
            reshard_loader_state(st, 4, 5, 4, 4)["batch"] == 4
        )  # 96 // 20: rounds down, skips none


def test_dcp_ranks_beyond_the_saved_world_reseed_deterministically() -> None:
    import random

    from aios.checkpoint.formats.dcp import rank_state_for
    from aios.data.rng import reseed

    assert rank_state_for(1, {1: "mine"}) == "mine" and rank_state_for(3, {1: "x"}) is None
    draws = []
    for _ in range(2):
        reseed(7, 100, 3)
        draws.append((torch.rand(2).tolist(), random.random()))
    assert draws[0] == draws[1]
    reseed(7, 100, 4)
    assert torch.rand(2).tolist() != draws[0][0]  # another rank, another stream


def test_dcp_rejects_full_format_checkpoint(tmp_path: Path) -> None:
    from aios.checkpoint import CheckpointStore
    from aios.checkpoint.formats.dcp import DcpCheckpointer
    from aios.errors import CheckpointError

    CheckpointStore(str(tmp_path)).save(5, {"modules": []})
    ck = DcpCheckpointer(str(tmp_path))
    with pytest.raises(CheckpointError, match="not a sharded \\(dcp\\) checkpoint"):
        ck.load(ck.store.latest(), [torch.nn.Linear(2, 2)], [])


# ------------------------------------------------------------------------------ URLs


def _roundtrip_in_process(url: str) -> None:
    """No process group: a plain module and its optimizer through DCP to ``url`` and back."""
    from aios.checkpoint.formats import dcp as adcp

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    ck = adcp.DcpCheckpointer(url, keep=1)
    for step in (1, 2):
        ck.save(
            step, [model], [opt], {"step": step}, {"rng": adcp.rng_state()}, async_save=step == 2
        )
    ck.wait()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want_opt = opt.state_dict()["state"][0]["exp_avg"].clone()
    torch.manual_seed(1)
    model2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    model2(torch.randn(3, 4)).sum().backward()
    opt2.step()
    info = ck.store.latest()
    assert info.step == 2 and [c.step for c in ck.store.list()] == [2]  # keep=1 pruned step 1
    common, per, saved_world = ck.load(info, [model2], [opt2])
    assert common == {"step": 2} and saved_world == 1 and 0 in per
    for k, v in model2.state_dict().items():
        assert torch.equal(v, want[k])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], want_opt)


def test_dcp_memory_url_round_trip() -> None:
    import fsspec

    _roundtrip_in_process("memory://aios-dcp-test/run")
    fsspec.filesystem("memory").rm("/aios-dcp-test", recursive=True)


@pytest.fixture
def gcs_emulator(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """gs://aios-dcp on the Cloud Storage stand-in (:mod:`aios_cloud_gcp.testing.gcs`: the
    emulator with the real service's preconditions and objects.move)."""
    pytest.importorskip(
        "aios_cloud_gcp",
        reason="gs:// is registered by aios-cloud-gcp: pip install -e ./packages/cloud-gcp",
    )
    from aios_cloud_gcp.testing.gcs import GCSFS_ENV, GcsEmulator

    for k, v in GCSFS_ENV.items():  # before gcsfs's first import reads it
        monkeypatch.setenv(k, v)
    pytest.importorskip("gcsfs", reason="gs:// needs gcsfs")
    pytest.importorskip(
        "gcp_storage_emulator",
        reason="gcp-storage-emulator is not installed: pip install gcp-storage-emulator",
    )
    with GcsEmulator() as gcs:
        for k, v in gcs.env.items():
            monkeypatch.setenv(k, v)
        gcs.make_bucket("aios-dcp")
        yield gcs.env


@pytest.fixture
def s3_moto(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    pytest.importorskip("s3fs", reason="s3:// needs s3fs")
    pytest.importorskip("moto.server", reason="needs moto[server]")
    pytest.importorskip(
        "aios_cloud_aws",
        reason="s3:// is registered by aios-cloud-aws: pip install -e ./packages/cloud-aws",
    )
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "AKIAAIOSTESTKEY00000",
        "AWS_SECRET_ACCESS_KEY": "aios-test-secret-never-written-0123456789",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", region_name="us-east-1", endpoint_url=env["AWS_ENDPOINT_URL"]).create_bucket(
        Bucket="aios-dcp"
    )
    yield env
    server.stop()


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_dcp_fsdp_on_object_store_save_2_resume_1(
    scheme: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two FSDP ranks write their shards to the bucket (async), one rank resumes from it."""
    env = request.getfixturevalue("gcs_emulator" if scheme == "gs" else "s3_moto")
    from aios.checkpoint import CheckpointStore

    url = f"{scheme}://aios-dcp/run-{scheme}"
    codes, log = _launch(
        2, {"ckpt": url, "steps": 3, "save_at": [2], "async": True, "out": str(tmp_path / "a")}, env
    )
    assert codes == [0, 0], log
    info = CheckpointStore(url).latest()
    assert info.step == 2 and info.meta["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "rank-00001.pt"} <= set(info.meta["files"])
    codes, log = _launch(
        1, {"ckpt": url, "steps": 3, "resume": True, "out": str(tmp_path / "b")}, env
    )
    assert codes == [0], log
    assert "saved by 2 ranks, loaded on 1 ranks" in log
    ref, got = _result(tmp_path / "a")["losses"], _result(tmp_path / "b")["losses"]
    assert got["3"] == pytest.approx(ref["3"], rel=1e-5)


def test_dcp_memory_and_local_in_process_round_trip(tmp_path: Path) -> None:
    _roundtrip_in_process(str(tmp_path / "local"))


# ------------------------------------------------------------------------------ the writer process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead (its parent, the rank, is gone or has not reaped it yet)
    with contextlib.suppress(FileNotFoundError):
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    return False


#: how the checkpoint process starts: DCP's spawn, or the standby forked before the process group
#: (what aios.init does on CPU; aios.checkpoint.formats.dcp_process.fork_standby)
STARTS = ["spawn", "standby"]


@pytest.mark.parametrize("start", STARTS)
def test_dcp_checkpoint_process_finishes_its_write_through_stop_signals(
    tmp_path: Path, start: str
) -> None:
    """A preemption SIGTERM (and SIGINT, SIGHUP) reaching the checkpoint process of a rank in
    the middle of a background write: the write completes and the checkpoint is committed. The
    writing thread runs at SCHED_IDLE (below the training ranks)."""
    from aios.checkpoint import CheckpointStore

    job = {
        "ckpt": str(tmp_path / "ckpt"),
        "steps": 3,
        "save_at": [2],
        "async": True,
        "gate": "signals",
        "out": str(tmp_path / "out"),
        "standby": start == "standby",
    }
    codes, log = _launch(2, job)
    assert codes == [0, 0], log
    for r in range(2):
        ov = _result(tmp_path / "out", r)["overlap"]
        assert ov["writer_pid"] != ov["rank_pid"], ov  # the signals went to the writer process
        # the standby became the checkpoint process; without one DCP spawned its own
        assert (ov["writer_pid"] == ov["standby_pid"]) == (start == "standby"), ov
        # it writes only on CPU time training leaves idle
        sched = int((tmp_path / "out" / f"writer-sched-{r}").read_text())
        assert sched == os.SCHED_IDLE, sched
    info = CheckpointStore(str(tmp_path / "ckpt")).latest()
    assert info is not None and info.step == 2, log


@pytest.mark.parametrize("start", STARTS)
def test_dcp_dead_checkpoint_process_falls_back_to_a_thread(tmp_path: Path, start: str) -> None:
    """The checkpoint process of one rank is SIGKILLed between saves: every rank says so once
    and writes the next save from a thread; nothing is lost."""
    from aios.checkpoint import CheckpointStore

    job = {
        "ckpt": str(tmp_path / "ckpt"),
        "steps": 4,
        "save_at": [2, 4],
        "async": True,
        "kill_writer_at": 3,
        "out": str(tmp_path / "out"),
        "standby": start == "standby",
    }
    codes, log = _launch(2, job)
    assert codes == [0, 0], log
    assert log.count("checkpoint process died on some rank") == 2, log  # once per rank
    store = CheckpointStore(str(tmp_path / "ckpt"))
    assert [(c.step, c.complete) for c in store.list()] == [(2, True), (4, True)], log


@pytest.mark.parametrize("start", STARTS)
def test_dcp_checkpoint_process_dies_with_its_rank(tmp_path: Path, start: str) -> None:
    """A rank SIGKILLed (the launcher's last resort) leaves no checkpoint process behind."""
    job = {
        "ckpt": str(tmp_path / "ckpt"),
        "steps": 2,
        "save_at": [2],
        "async": True,
        "die_hard": True,
        "out": str(tmp_path / "out"),
        "standby": start == "standby",
    }
    codes, log = _launch(2, job)
    assert codes == [-9, -9], (codes, log)
    pids = [int((tmp_path / "out" / f"writer-pid-{r}").read_text()) for r in range(2)]
    end = time.monotonic() + 15
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], f"checkpoint processes outlived their ranks: {pids}"


# ------------------------------------------------------------------------------ digests


def _flip4(path: Path, frac: float) -> bytes:
    """Invert 4 bytes at ``frac`` of the file (size unchanged); returns the original bytes."""
    raw = path.read_bytes()
    data = bytearray(raw)
    at = int(len(data) * frac)
    for k in range(4):
        data[at + k] ^= 0xFF
    path.write_bytes(bytes(data))
    return raw


def test_dcp_every_file_is_verified_against_its_digest(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    """The 4-rank checkpoint written by DCP's checkpoint process: every shard and ``.metadata``
    carries the digest its writer computed; 4 inverted bytes at 20/35/70/90% of a shard or of
    ``.metadata`` make every load refuse in one line naming the file, before torch reads it."""
    from aios.checkpoint import DIGEST, DIGESTS_FILE
    from aios.checkpoint.formats.dcp import DcpCheckpointer
    from aios.errors import CheckpointError

    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference["ckpt"], ckpt)
    ck = DcpCheckpointer(str(ckpt))
    info = ck.store.latest()
    files = info.meta["files"]
    assert {".metadata", "__0_0.distcp", "__3_0.distcp", DIGESTS_FILE} <= set(files)
    assert all(e.get(DIGEST) and e.get("size") for e in files.values()), files
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Linear(32, 1))
    for name in ("__2_0.distcp", ".metadata"):
        for frac in (0.2, 0.35, 0.7, 0.9):
            raw = _flip4(Path(info.path) / name, frac)
            with pytest.raises(CheckpointError) as ei:
                ck.load(ck.store.latest(), [model], [])
            msg = str(ei.value)
            assert (
                f"checkpoint '{info.path}' is corrupt: {name} does not match" in msg
                and "\n" not in msg
                and "does not fit" not in msg
            ), (name, frac, msg)
            (Path(info.path) / name).write_bytes(raw)


# ------------------------------------------------------------------------------ named saves


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_replaceable_named_save_on_an_object_store_keeps_a_complete_copy_under_its_name(
    scheme: str, request: pytest.FixtureRequest
) -> None:
    """Object stores cannot rename a directory: ``save(path, replace=True)`` writes a new
    version and then moves the name's pointer to it. A reader of the name gets the last
    committed copy at every moment; a save stopped before its pointer moved leaves the name on
    the previous copy, and the next save removes what it left."""
    request.getfixturevalue("gcs_emulator" if scheme == "gs" else "s3_moto")
    from aios.checkpoint import POINTER_SUFFIX, VERSION_SEP, CheckpointStore
    from aios.errors import CheckpointError

    url = f"{scheme}://aios-dcp/named-{scheme}"
    store = CheckpointStore(url, keep=None)

    def save(step: int, replace: bool) -> Any:
        staging = store.begin(step, "best", replace=replace)
        store.write_file(staging, "state.pt", lambda f: f.write(b"x" * step))
        return staging

    def best() -> tuple[int, bytes]:  # what a reader of <url>/best gets
        info = store.resolve(f"{url}/best")
        return info.step, store.read_file(info, "state.pt")

    def names() -> list[str]:
        store.fs.invalidate_cache()
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in store.fs.ls(store.root))

    store.commit(save(1, replace=False), {})  # a plain copy, written in place
    assert best() == (1, b"x")
    with pytest.raises(CheckpointError, match="already exists.*replace=True"):
        store.begin(2, "best")
    store.commit(save(2, replace=True), {})
    assert best() == (2, b"xx")
    first = names()
    assert first[0] == "best" + POINTER_SUFFIX and len(first) == 2, first  # the plain copy went
    assert first[1].startswith("best" + VERSION_SEP)
    # stopped after its files and marker, before its pointer moved (a preemption, a crash)
    staging = save(3, replace=True)

    def killed(*_: Any) -> str:
        raise OSError("the process died here")

    real = store._point
    store._point = killed  # type: ignore[method-assign]
    with pytest.raises(CheckpointError):
        store.commit(staging, {})
    store._point = real  # type: ignore[method-assign]
    assert best() == (2, b"xx")  # the name still holds the last committed copy
    assert len(names()) == 3
    store.commit(save(4, replace=True), {})
    assert best() == (4, b"xxxx")
    after = names()
    assert len(after) == 2 and after[0] == "best" + POINTER_SUFFIX, after  # 2 and 3 are gone
    with pytest.raises(CheckpointError, match="already exists"):
        store.begin(5, "best")  # a name held through its pointer is not overwritten by accident


def test_save_best_under_fsdp_on_a_bucket(tmp_path: Path, s3_moto: dict[str, str]) -> None:
    """The nanoGPT habit with checkpoints on a bucket: "save when validation improves" under
    FSDP (every rank writes its DCP shards into the new version), 10 times. (On S3: the GCS
    emulator lacks the moveTo call gcsfs tries first for DCP's rename of .metadata, and gcsfs
    retries its 501 for about 35 s a save before copying.)"""
    from aios.checkpoint import POINTER_SUFFIX, CheckpointStore
    from aios.testing.strategy_contract import free_port

    url = "s3://aios-dcp/best-run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    env.update({**s3_moto, "AIOS_LOGGING__TENSORBOARD": "false", "OMP_NUM_THREADS": "1"})
    script = Path(__file__).parent / "scripts" / "best_every_eval.py"
    r = subprocess.run(
        [*python("-c", "from aios.cli.run import main; main()")]
        + [f"master_port={free_port()}", "--nprocs", "2", "strategy=fsdp", str(script), url],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "best 0.0 at step 20" in r.stdout and "done at step 20" in r.stdout, r.stdout
    store = CheckpointStore(url, keep=None)
    info = store.resolve(f"{url}/best")
    assert info.step == 20 and info.meta["strategy"] == "FSDPStrategy"
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= set(info.meta["files"])
    store.fs.invalidate_cache()
    named = [n for n in (e.rsplit("/", 1)[-1] for e in store.fs.ls(store.root)) if n[:4] == "best"]
    assert sorted(named)[0] == "best" + POINTER_SUFFIX and len(named) == 2, named  # one version
