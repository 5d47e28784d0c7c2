"""Issue 36, item 4: checkpoints keep working under replica groups (``ft.replica_groups``).

Periodic checkpoints (``checkpoint.every``) and the emergency checkpoint on a stop notice
(SIGTERM to aios-run) are written once, by one live group (the first in the step's quorum; when
it is lost another takes over), under aios-run's lock of the directory; each holds the global
data position counted in committed samples; a run resumes from them with another number of
groups or with plain ddp and trains every sample of the epoch exactly once. A stop of the whole
run stops every group at the same step and leaves no process behind. CPU, gloo; every wait is on
a file or a process, never on a clock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from aios.testing.zygote import python

pytest.importorskip("torch")
pytest.importorskip("torchft", reason="torchft is not installed (the extra aios-core[ft])")

SCRIPT = Path(__file__).parent / "scripts" / "ft_ckpt.py"
N = 64


def _command(tmp: Path, nprocs: int, groups: int, *args: str) -> list[str]:
    from aios.testing.strategy_contract import free_port

    ft = [f"ft.replica_groups={groups}", "ft.heartbeat_timeout_ms=500", "ft.timeout=30"]
    return (
        [*python("-c", "from aios.cli.run import main; main()")]
        + ["--nprocs", str(nprocs), f"master_port={free_port()}"]
        + (ft if groups > 1 else [])
        + [f"checkpoint.dir={tmp / 'ckpt'}", "checkpoint.keep=10", *args, str(SCRIPT)]
    )


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIOS_", "RUST_LOG", "FT_"))}
    env.update(
        {
            "AIOS_LOGGING__TENSORBOARD": "false",
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "OMP_NUM_THREADS": "1",
            "FT_OUT": str(tmp),
            **extra,
        }
    )
    return env


def _run(tmp: Path, nprocs: int, groups: int, *args: str, **env: str):
    return subprocess.run(
        _command(tmp, nprocs, groups, *args),
        capture_output=True,
        text=True,
        env=_env(tmp, **env),
        cwd=tmp,
        timeout=900,
    )


def _logs(tmp: Path, tag: str) -> dict[str, list[dict]]:
    return {
        p.name: [json.loads(line) for line in p.read_text().splitlines()]
        for p in sorted(tmp.glob(f"{tag}-g*-r*.jsonl"))
    }


def _trained(tmp: Path, tag: str) -> list[int]:
    """The sample ids trained in committed steps by the run ``tag``: each rank's batch of each
    committed step it contributed to (a healing group's first batch trains nothing)."""
    return [i for run in _logs(tmp, tag).values() for e in run if e["counted"] for i in e["idx"]]


def _checkpoints(tmp: Path) -> dict[int, dict]:
    """step -> (the writer's record directory, the data position in the checkpoint)."""
    import torch
    from aios.checkpoint import CheckpointStore

    store = CheckpointStore(str(tmp / "ckpt"), keep=None)
    out = {}
    for info in store.list():
        assert info.complete, info
        state = store.load(info)
        assert isinstance(state, dict)
        (loader,) = state["loaders"]
        out[info.step] = {"record": info.meta["record"], "loader": loader}
        assert isinstance(state["step"], int) and torch.is_tensor(state["modules"][0]["0.weight"])
    return out


def _group_saves(tmp: Path) -> dict[str, list[int]]:
    """Each group's record: the steps of the checkpoints it wrote."""
    (run,) = (tmp / "runs").iterdir()
    out = {}
    for diag in [run / "diagnostics.json", *sorted(run.glob("group*/diagnostics.json"))]:
        saves = json.loads(diag.read_text()).get("checkpoints", [])
        out[str(diag.parent)] = [c["step"] for c in saves]
    return out


def _left_behind(tmp: Path) -> list[int]:
    """Processes of this test's runs still alive (their environment names its FT_OUT)."""
    mark = f"FT_OUT={tmp}".encode()
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark in environ and state != "Z":
            pids.append(int(proc.name))
    return pids


def _two_groups_stopping_at_6(tmp: Path) -> subprocess.Popen[str]:
    """aios-run with 2 groups of one process whose ranks, after committing step 6, write their
    marker and wait for a notice."""
    return subprocess.Popen(
        _command(tmp, 2, 2),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp, FT_TERM_STEP="6"),
        cwd=tmp,
    )


def _sigterm_when(
    proc: subprocess.Popen[str], markers: list[Path], sig: int = signal.SIGTERM
) -> tuple[str, str]:
    """SIGTERM (or ``sig``) to aios-run once every marker file exists (the ranks wrote them at
    the step the test stops at); aios-run's (stdout, stderr). Never leaves it running."""
    try:
        for marker in markers:
            while not marker.exists():
                assert proc.poll() is None, proc.communicate()[1][-3000:]
                time.sleep(0.05)
        proc.send_signal(sig)
        return proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_periodic_checkpoints_written_once_by_a_live_group(tmp_path: Path) -> None:
    """checkpoint.every=3 with 2 groups; group 0 (the first writer) is SIGKILLed after step 5:
    group 1 writes the next checkpoints alone, each step's checkpoint is written by one group,
    and each holds the samples committed up to its step (2 per group in each step's quorum;
    steps with one group make the epoch longer than 16 steps)."""
    r = _run(tmp_path, 2, 2, "checkpoint.every=3", FT_KILL_GROUP="0", FT_KILL_STEP="5")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "aios: replica group 0 lost at step" in r.stderr
    assert "checkpoint dir" not in r.stderr  # no group found the directory locked
    # the surviving group's log: how many samples the committed steps consumed, step by step
    (surv,) = [v for k, v in _logs(tmp_path, "a").items() if k.startswith("a-g1-")]
    committed = [e for e in surv if e["ok"]]
    last = len(committed)
    assert [e["step"] for e in committed] == list(range(1, last + 1))
    ckpts = _checkpoints(tmp_path)  # every 3 steps, and the run's last step at its end
    assert sorted(ckpts) == sorted({*range(3, last + 1, 3), last})
    consumed, pos = {}, 0
    for e in committed:
        pos = min(N, pos + 2 * e["p"])
        consumed[e["step"]] = pos
    assert any(e["p"] == 1 for e in committed)  # steps committed by group 1 alone
    for step, c in ckpts.items():
        # the last one is written at the run's end: the epoch is over, the next one not begun
        want = (1, 0) if step == last else (0, consumed[step])
        assert (c["loader"]["epoch"], c["loader"]["samples"]) == want, (step, c, consumed)
        assert c["loader"]["batch_size"] == 2 and c["loader"]["world"] == 2
    # one writer per checkpoint: the records' saves never overlap; group 0 wrote the one at
    # step 3, group 1 (alone after group 0 was lost at step 5) the one at step 6
    saves = _group_saves(tmp_path)
    g1 = next(v for k, v in saves.items() if k.endswith("group1"))
    assert 6 in g1 and 3 not in g1
    every = [s for v in saves.values() for s in v]
    assert len(every) == len(set(every)), saves
    assert ckpts[6]["record"].endswith("/group1") and not ckpts[3]["record"].endswith("/group1")
    # every sample of the epoch trained once (the epoch's last step is padded from its start
    # when the steps with one group left it short)
    seen = _trained(tmp_path, "a")
    assert set(seen) == set(range(N))
    assert len(seen) - N < 2 * 2  # at most the padding of one short step


@pytest.mark.parametrize("shape", ["ddp", "groups3"])
def test_stop_writes_one_emergency_checkpoint_and_resumes_at_another_shape(
    tmp_path: Path, shape: str
) -> None:
    """SIGTERM to aios-run while 2 groups train: both groups stop at the same step, one
    emergency checkpoint (step 7, 28 committed samples) is written by one group, aios-run exits
    75 with the lighthouse and every group's process gone; the run resumes with plain ddp on 2
    processes, or with 3 groups, and trains the rest of the epoch: every sample once."""
    proc = _two_groups_stopping_at_6(tmp_path)
    # both groups committed step 6 and wait for their notice
    out, err = _sigterm_when(proc, [tmp_path / f"at-g{g}-r0" for g in (0, 1)])
    assert proc.returncode == 75, err[-3000:]
    assert _left_behind(tmp_path) == []
    said = out + err  # the runtime's lines (rank 0 of each group) go to stdout
    assert said.count("aios: checkpoint for step 7 written") == 1, said[-3000:]
    assert "restarting replica group" not in err  # a stop is no loss
    ckpts = _checkpoints(tmp_path)
    assert list(ckpts) == [7]
    assert ckpts[7]["loader"]["samples"] == 7 * 4 and ckpts[7]["loader"]["epoch"] == 0
    saves = _group_saves(tmp_path)
    assert sorted(s for v in saves.values() for s in v) == [7], saves
    first = _logs(tmp_path, "a")
    assert {max(e["step"] for e in run) for run in first.values()} == {7}  # the same stop step
    # resume at another shape
    (tmp_path / "runs").rename(tmp_path / "runs-a")
    nprocs, groups = (2, 1) if shape == "ddp" else (3, 3)
    r = _run(tmp_path, nprocs, groups, FT_TAG="b")
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout + r.stderr
    assert "aios: resumed from" in said and "at step 7" in said, said[-3000:]
    if shape == "ddp":  # 4 samples per step before and after
        assert "global batch" not in said, said[-3000:]
    else:
        assert "the global batch is now 6, was 4" in said, said[-3000:]
    if shape == "ddp":  # the processes of every group counted: 2 before and after
        assert "world size 2," in said and "resumed at step 7:" not in said, said[-3000:]
    else:
        assert "world size 2," in said and "resumed at step 7: 2 -> 3 processes" in said
    second = _logs(tmp_path, "b")
    assert len(second) == nprocs
    assert min(e["step"] for run in second.values() for e in run) == 8
    seen = _trained(tmp_path, "a") + _trained(tmp_path, "b")
    assert sorted(seen) == list(range(N))


def test_sighup_stops_the_groups_as_sigterm_does(tmp_path: Path) -> None:
    """The terminal or ssh session of ``aios-run`` closed (SIGHUP) while 2 groups train: the
    ranks get their notice (SIGTERM, as torch's elastic agent passes SIGHUP on without groups),
    one emergency checkpoint is written, no group is restarted, nothing is left running, exit
    75."""
    proc = _two_groups_stopping_at_6(tmp_path)
    out, err = _sigterm_when(proc, [tmp_path / f"at-g{g}-r0" for g in (0, 1)], signal.SIGHUP)
    assert proc.returncode == 75, err[-3000:]
    assert _left_behind(tmp_path) == []
    assert (out + err).count("aios: checkpoint for step 7 written") == 1, err[-3000:]
    assert "restarting replica group" not in err and "lost" not in err
    assert list(_checkpoints(tmp_path)) == [7]


def test_heal_transfer_listens_on_the_run_address_only() -> None:
    """The heal's state server (aios.ft.transport) binds the address aios chose for the run and
    advertises it (torchft 0.2.0's own binds every interface and advertises the host name); it
    serves the state of the step it was given until torchft disallows it, read back with
    weights_only=True."""
    import urllib.error
    from datetime import timedelta

    import torch
    from aios.ft.transport import bound_transport

    t = bound_transport("127.0.0.1", timedelta(seconds=30))
    try:
        assert t._server.server_address[0] == "127.0.0.1"
        assert t.metadata().startswith("http://127.0.0.1:")
        state = {"user": {"w": torch.arange(4.0), "pos": {"epoch": 0, "pos": 8}}, "torchft": {}}
        t.send_checkpoint([1], 3, state, timedelta(seconds=30))
        got = t.recv_checkpoint(0, t.metadata(), 3, timedelta(seconds=30))
        assert torch.equal(got["user"]["w"], state["user"]["w"])
        assert got["user"]["pos"] == {"epoch": 0, "pos": 8}
        t.disallow_checkpoint()
    finally:
        t.shutdown()
    quick = bound_transport("127.0.0.1", timedelta(0))  # a request for a step not served
    try:
        quick.send_checkpoint([1], 3, {"x": 1}, timedelta(0))
        with pytest.raises(urllib.error.HTTPError, match="404"):
            quick.recv_checkpoint(0, quick.metadata(), 4, timedelta(seconds=30))
    finally:
        quick.shutdown()


def test_a_plain_ddp_checkpoint_resumes_under_groups(tmp_path: Path) -> None:
    """The other direction: plain ddp on 2 processes stopped by SIGTERM after step 6 writes its
    emergency checkpoint at step 7; ``ft.replica_groups=2`` resumes it (each group loads it,
    the position is 28 samples of every rank together) and trains the rest: every sample once."""
    proc = subprocess.Popen(
        _command(tmp_path, 2, 1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(tmp_path, FT_TERM_STEP="6"),
        cwd=tmp_path,
    )
    _, err = _sigterm_when(proc, [tmp_path / f"at-g0-r{rank}" for rank in (0, 1)])
    assert proc.returncode == 75, err[-3000:]
    assert list(_checkpoints(tmp_path)) == [7]
    (tmp_path / "runs").rename(tmp_path / "runs-a")
    r = _run(tmp_path, 2, 2, FT_TAG="b")
    assert r.returncode == 0, r.stderr[-3000:]
    said = r.stdout + r.stderr
    assert said.count("aios: resumed from") == 2, said[-3000:]  # each group's rank 0
    assert "resumed at step 7:" not in said  # 2 processes, 4 samples a step: the same shape
    assert min(e["step"] for run in _logs(tmp_path, "b").values() for e in run) == 8
    seen = _trained(tmp_path, "a") + _trained(tmp_path, "b")
    assert sorted(seen) == list(range(N))
