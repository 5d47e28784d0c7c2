"""``aios-run``'s warm start (:mod:`aios.launcher.warm`): the ranks are forked from a zygote that
imported torch and aios once, and the script cannot tell: same ``sys.argv``, ``__file__``,
``__name__``, ``sys.path[0]``, environment, own random seeds, the ranks are ``aios-run``'s own
children, the exit code and the traceback are a fresh rank's. Off with ``AIOS_RUN_WARM_START=0``;
refused (fresh start) for a variable that may be read at import time."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from aios.launcher import warm
from aios.testing.launch import aios_run, run_env

SCRIPT = """
import json, os, random, sys
import aios
from aios.launcher import warm

out = {
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0],
    "warm": warm.is_rank(), "random": random.random(), "ppid": os.getppid(),
    "launcher": int(os.environ["AIOS_RUN_LAUNCHER_PID"]), "rank": os.environ["RANK"],
    "mine": os.environ.get("MY_SETTING"), "cwd": os.getcwd(), "sid": os.getsid(0) == os.getpid(),
}
with open(f"out{os.environ['RANK']}.json", "w") as f:
    json.dump(out, f)
if "fail" in sys.argv and os.environ["RANK"] == "1":
    raise ValueError("boom on purpose")
sys.exit(3 if "three" in sys.argv else 0)
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, object]]:
    """One warm and one fresh run of the same failing script (each pays the launch once)."""
    out = {}
    for name, on in (("warm", True), ("fresh", False)):
        tmp = tmp_path_factory.mktemp(name)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "train.py").write_text(textwrap.dedent(SCRIPT))
        env = run_env(tmp, MY_SETTING="x")
        off = [] if on else ["launch.warm_start=false"]  # the setting (the env var: below)
        res = aios_run(["--nprocs", "2", *off, "sub/train.py", "a", "fail"], cwd=tmp, env=env)
        out[name] = (tmp, res)
    return out


def _ranks(tmp: Path) -> list[dict]:
    return [json.loads((tmp / f"out{r}.json").read_text()) for r in (0, 1)]


def test_ranks_start_warm_and_see_what_a_fresh_rank_sees(runs) -> None:
    warm_ranks, fresh_ranks = _ranks(runs["warm"][0]), _ranks(runs["fresh"][0])
    assert [r["warm"] for r in warm_ranks] == [True, True]
    assert [r["warm"] for r in fresh_ranks] == [False, False]
    for w, f, tmp in zip(warm_ranks, fresh_ranks, (runs["warm"][0],) * 2, strict=True):
        assert w["argv"] == f["argv"] == ["sub/train.py", "a", "fail"]
        assert w["name"] == f["name"] == "__main__"
        assert w["file"] == str(tmp / "sub" / "train.py")
        assert w["path0"] == str(tmp / "sub")
        assert w["cwd"] == str(tmp)
        assert w["mine"] == "x"
        assert w["ppid"] == w["launcher"]  # aios-run's own child, as a fresh rank is
        assert w["sid"] and f["sid"]  # its own session (the agent stops its process group)
    assert warm_ranks[0]["random"] != warm_ranks[1]["random"]


def test_a_warm_rank_fails_as_a_fresh_one_does(runs) -> None:
    (_, w), (_, f) = runs["warm"], runs["fresh"]
    assert w.returncode == f.returncode == 1
    for res in (w, f):
        assert "exited with code 1 on rank 1" in res.stderr
        assert 'sub/train.py", line' in res.stderr and "ValueError: boom on purpose" in res.stderr
    assert "warm.py" not in w.stderr and "aios/cli/run.py" not in w.stderr
    assert w.stdout == f.stdout


def test_exit_code_of_the_script(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    res = aios_run(["--nprocs", "2", "train.py", "three"], cwd=tmp_path)
    assert res.returncode == 3, res.stderr
    assert [r["warm"] for r in _ranks(tmp_path)] == [True, True]


def test_only_variables_read_when_used_may_differ() -> None:
    base = {"PATH": "/bin", "HOME": "/h"}
    assert warm.env_is_warm_safe(base, {**base, "RANK": "1", "AIOS_RUN_ID": "x", "NCCL_DEBUG": "1"})
    assert warm.env_is_warm_safe(base, {**base, "MASTER_PORT": "1", "TORCHELASTIC_RUN_ID": "r"})
    for var in ("LD_PRELOAD", "PYTHONPATH", "TORCH_LOGS", "AIOS_STRATEGY", "XLA_FLAGS"):
        assert not warm.env_is_warm_safe(base, {**base, var: "x"}), var
    assert not warm.env_is_warm_safe(base, {"PATH": "/usr/bin", "HOME": "/h"})
    assert not warm.env_is_warm_safe(base, {"PATH": "/bin"})


def test_only_python_u_of_a_script_or_module_starts_warm() -> None:
    py = sys.executable
    assert warm.parse_command([py, "-u", "t.py", "x"]) == ("t.py", None, ["x"])
    assert warm.parse_command([py, "-u", "-m", "pkg.mod", "y"]) == (None, "pkg.mod", ["y"])
    assert warm.parse_command([py, "t.py"]) is None
    assert warm.parse_command([py, "-u", "-X", "dev", "t.py"]) is None
    assert warm.parse_command(["/usr/bin/env", "-u", "t.py"]) is None


def test_turned_off_by_setting() -> None:
    assert not warm.enabled({"AIOS_RUN_WARM_START": "0"})
    assert not warm.enabled({"AIOS_LAUNCH__WARM_START": "false"})
    assert warm.enabled({}) == sys.platform.startswith("linux")


def test_a_script_without_torch_or_aios_starts_fresh(tmp_path: Path) -> None:
    """It would only wait for imports it never makes."""
    plain = tmp_path / "plain.py"
    plain.write_text("import os, sys\nprint(os.environ['RANK'])\n")
    assert not warm.worth_it(str(plain))
    (tmp_path / "t.py").write_text("import torch\n")
    assert warm.worth_it(str(tmp_path / "t.py"))
    assert warm.worth_it(str(tmp_path / "missing.py"))


def test_a_sitecustomize_on_the_path_runs_in_every_rank_with_its_own_env(tmp_path: Path) -> None:
    """An interpreter start-up hook the user put on PYTHONPATH (``sitecustomize``: test
    harnesses, profilers, fault injectors) runs in each fresh rank with that rank's RANK; a
    forked rank would only inherit its one run in the zygote, so such a launch starts fresh."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(
        "import os\n"
        "if os.environ.get('RANK') is not None:\n"
        "    open(os.path.join(os.environ['HOOK_OUT'], 'hook' + os.environ['RANK']), 'w')\n"
    )
    (tmp_path / "train.py").write_text(textwrap.dedent(SCRIPT))
    env = run_env(tmp_path, MY_SETTING="x", HOOK_OUT=str(tmp_path), PYTHONPATH=str(hooks))
    res = aios_run(["--nprocs", "2", "train.py"], cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "hook0").exists() and (tmp_path / "hook1").exists()
    assert [r["warm"] for r in _ranks(tmp_path)] == [False, False]
