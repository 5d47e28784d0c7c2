"""``aios-run``: plans, dry runs without torch, bad input as one line + exit 2, failures with the
rank and exit code, plain torch.distributed scripts unchanged, restarts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RUN = [
    sys.executable,
    "-c",
    "import sys; sys.argv[0] = 'aios-run'; from aios.cli.run import main; main()",
]


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIOS_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
    }
    env.update(
        {
            "AIOS_LOGGING__RUN_DIR": str(tmp / "runs"),
            "AIOS_LOGGING__TENSORBOARD": "false",
            "OMP_NUM_THREADS": "1",
        }
    )
    env.update(extra)
    return env


def aios_run(
    tmp: Path, *args: str, timeout: float = 180, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RUN, *args],
        capture_output=True,
        text=True,
        env=_env(tmp, **env),
        cwd=tmp,
        timeout=timeout,
    )


def _script(tmp: Path, body: str, name: str = "train.py") -> Path:
    p = tmp / name
    p.write_text(textwrap.dedent(body))
    return p


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("aios-run: error: ")
    assert "Traceback" not in r.stderr
    return lines[0]


# ------------------------------------------------------------------------------ dry run


def test_launch_dry_run_prints_plan_without_torch(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    code = (
        "import sys, json; sys.argv = ['aios-run', '--nprocs', '2', '--dry-run', '--json', 'precision=bf16-mixed', "
        f"'checkpoint.every=5', {str(script)!r}, '--lr', '0.1']\n"
        "from aios.cli.run import main\nmain()\n"
        "assert 'torch' not in sys.modules, 'dry-run imported torch'\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=_env(tmp_path, WANDB_API_KEY="sekrit-42"),
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["backend"] == "cpu" and plan["launcher"] == "elastic" and plan["world_size"] == 2
    host = plan["hosts"][0]
    assert [rk["RANK"] for rk in host["ranks"]] == ["0", "1"]
    assert host["command"][1:3] == ["-m", "torch.distributed.run"]
    assert host["command"][-3:] == [str(script), "--lr", "0.1"]
    worker_cfg = json.loads(host["env"]["AIOS_RUN_CONFIG"])
    assert worker_cfg == {
        "backend": "cpu",
        "nprocs": 2,
        "precision": "bf16-mixed",
        "checkpoint": {"every": 5},
        "logging": {"run_dir": str(tmp_path / "runs"), "tensorboard": False},  # from AIOS_* env
    }
    assert "sekrit" not in r.stdout
    assert not (tmp_path / "runs").exists()  # nothing started, nothing written


def test_launch_dry_run_human_output_single_process(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    r = aios_run(tmp_path, "--dry-run", str(script))
    assert r.returncode == 0, r.stderr
    assert "backend:    cpu" in r.stdout and "launcher:   direct, world size 1" in r.stdout
    assert f"command: {sys.executable} {script}" in r.stdout


# ------------------------------------------------------------------------------ bad input


def test_launch_missing_script(tmp_path):
    r = aios_run(tmp_path, "nope.py")
    assert r.returncode == 2
    assert "script 'nope.py' not found" in _one_line_error(r)


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_launch_bad_nprocs(tmp_path, value):
    script = _script(tmp_path, "print('hi')\n")
    r = aios_run(tmp_path, "--nprocs", value, str(script))
    assert r.returncode == 2
    assert "nprocs" in _one_line_error(r)


def test_launch_unknown_backend(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    r = aios_run(tmp_path, "--backend", "quantum", str(script))
    assert r.returncode == 2
    line = _one_line_error(r)
    assert "'quantum'" in line and "choose one of" in line


def test_launch_bad_override(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    r = aios_run(tmp_path, "checkpoint.evry=3", str(script))
    assert r.returncode == 2
    assert "unknown config key 'checkpoint.evry'" in _one_line_error(r)


def test_launch_explicit_port_in_use(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = aios_run(tmp_path, "--nprocs", "2", "--master-port", str(port), str(script))
    assert r.returncode == 2
    line = _one_line_error(r)
    assert f"port {port} on 127.0.0.1 is in use" in line and "--master-port" in line


def test_launch_default_port_in_use_picks_free_one(tmp_path, monkeypatch):
    from aios.cli.run import build_plan
    from aios.plugins.registry import reset_registry

    for k in list(os.environ):
        if k.startswith("AIOS_"):
            monkeypatch.delenv(k)
    reset_registry()
    script = _script(tmp_path, "print('hi')\n")
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", 29500))
            s.listen()
        except OSError:
            pass  # already taken by something else: the same situation
        cfg, spec, plan, notes = build_plan(str(script), [], [], {"nprocs": 2}, None)
    assert cfg.master_port != 29500
    assert notes and "29500 is in use" in notes[0]
    cmd = plan.hosts[0].command
    assert cmd[cmd.index("--master-port") + 1] == str(cfg.master_port)
    reset_registry()


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def test_launch_unwritable_checkpoint_dir(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    (tmp_path / "blocker").write_text("x")
    r = aios_run(tmp_path, f"checkpoint.dir={tmp_path / 'blocker' / 'ck'}", str(script))
    assert r.returncode == 2
    assert "is not writable" in _one_line_error(r)


def test_launch_corrupt_checkpoint_dir(tmp_path):
    script = _script(tmp_path, "print('hi')\n")
    ck = tmp_path / "ck" / "ckpt-000000004"
    ck.mkdir(parents=True)
    (ck / "state.pt").write_bytes(b"short")
    (ck / "aios-checkpoint.json").write_text(
        json.dumps({"step": 4, "files": {"state.pt": {"size": 999, "sha256": "0"}}})
    )
    r = aios_run(tmp_path, f"checkpoint.dir={tmp_path / 'ck'}", str(script))
    assert r.returncode == 2
    line = _one_line_error(r)
    assert "is corrupt" in line and "checkpoint.resume=false" in line
    assert not (tmp_path / "runs").exists()  # the script never started


# ------------------------------------------------------------------------------ running


def test_launch_direct_script_exit_code_and_args(tmp_path):
    script = _script(
        tmp_path,
        """
        import os, sys, json
        print("args", sys.argv[1:], os.environ["AIOS_RUN_BACKEND"], json.loads(os.environ["AIOS_RUN_CONFIG"]))
        sys.exit(int(sys.argv[1]))
    """,
    )
    r = aios_run(tmp_path, "seed=3", str(script), "0", "--flag")
    assert r.returncode == 0, r.stderr
    assert "args ['0', '--flag'] cpu {'backend': 'cpu', 'seed': 3, 'logging'" in r.stdout
    r = aios_run(tmp_path, str(script), "7")
    assert r.returncode == 7
    assert r.stderr.strip().endswith(
        f"aios-run: error: {script} exited with code 7 on rank 0; see its output above"
    )


def test_launch_rank_failure_names_rank_and_code(tmp_path, free_port):
    script = _script(
        tmp_path,
        """
        import os, sys, time
        if os.environ["RANK"] == "1":
            sys.exit(3)
        time.sleep(60)  # rank 0 would hang: the launcher must stop it
    """,
    )
    r = aios_run(
        tmp_path, "--nprocs", "2", "--master-port", str(free_port()), str(script), timeout=60
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert (
        f"aios-run: error: {script} exited with code 3 on rank 1 (other ranks stopped)" in r.stderr
    )


def test_launch_plain_torch_distributed_script_unchanged(tmp_path, free_port):
    pytest.importorskip("torch")
    script = _script(
        tmp_path,
        """
        import os
        import torch
        import torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([dist.get_rank() + 1.0])
        dist.all_reduce(t)
        print(f"rank={dist.get_rank()} local={os.environ['LOCAL_RANK']} world={dist.get_world_size()} sum={t.item()}")
        dist.destroy_process_group()
    """,
    )
    r = aios_run(tmp_path, "--nprocs", "2", "--master-port", str(free_port()), str(script))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[rank0]:rank=0 local=0 world=2 sum=3.0" in r.stdout
    assert "[rank1]:rank=1 local=1 world=2 sum=3.0" in r.stdout


def test_launch_max_restarts_recovers(tmp_path, free_port):
    script = _script(
        tmp_path,
        """
        import os, sys
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        print("attempt", attempt, "rank", os.environ["RANK"])
        sys.exit(5 if attempt == 0 else 0)
    """,
    )
    r = aios_run(
        tmp_path,
        "--nprocs",
        "2",
        "--max-restarts",
        "1",
        "--master-port",
        str(free_port()),
        str(script),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "attempt 0" in r.stdout and "attempt 1" in r.stdout
    r = aios_run(
        tmp_path,
        "--nprocs",
        "2",
        "--max-restarts",
        "0",
        "--master-port",
        str(free_port()),
        str(script),
    )
    assert r.returncode == 5


def test_launch_aios_run_subcommand_and_module(tmp_path):
    pkg = tmp_path / "mytrain"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("print('module ran')\n")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.argv[0] = 'aios'; from aios.cli.main import main; main()",
            "run",
            "--dry-run",
            "-m",
            "mytrain",
            "--x",
        ],
        capture_output=True,
        text=True,
        env=_env(tmp_path),
        cwd=tmp_path,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert f"command: {sys.executable} -m mytrain --x" in r.stdout
    r = aios_run(tmp_path, "-m", "mytrain", PYTHONPATH=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "module ran" in r.stdout


def test_launch_options_and_overrides_in_any_order_before_script():
    from aios.cli.run import reorder_args

    assert reorder_args(["--nprocs", "2", "seed=3", "--dry-run", "t.py", "--lr", "x=1"]) == [
        "--nprocs",
        "2",
        "--dry-run",
        "seed=3",
        "t.py",
        "--lr",
        "x=1",
    ]
    assert reorder_args(["a=1", "--backend=cpu", "-m", "pkg.mod", "b=2", "--x"]) == [
        "--backend=cpu",
        "-m",
        "pkg.mod",
        "a=1",
        "b=2",
        "--x",
    ]
    assert reorder_args(["--json", "--", "t.py", "--json"]) == ["--json", "t.py", "--json"]


def test_preempted_node_without_rank_0_points_at_the_checkpoint_dir(capsys):
    # on a node other than 0 no local rank writes the checkpoint: the message must not claim
    # that no checkpoint.dir was configured
    from types import SimpleNamespace

    from aios.launcher.outcome import preempted_exit as _preempted_exit

    cfg = SimpleNamespace(checkpoint=SimpleNamespace(dir="/shared/ckpt"))
    with pytest.raises(SystemExit) as info:
        _preempted_exit(cfg, {2: "preempted", 3: "preempted"})
    err = capsys.readouterr().err
    assert info.value.code == 75
    assert "written by rank 0 under /shared/ckpt" in err and "no checkpoint.dir" not in err
    with pytest.raises(SystemExit):
        _preempted_exit(SimpleNamespace(checkpoint=SimpleNamespace(dir=None)), {0: "preempted"})
    assert "no checkpoint.dir was configured" in capsys.readouterr().err
