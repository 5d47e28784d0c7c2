"""Config input cannot hang or crash the parser: a YAML alias bomb, deep nesting, a recursive
alias, a 5,000-digit integer and zero/negative mesh sizes are one line, exit 2, through
``aios config validate`` and ``aios-run --dry-run`` (overrides and config files); nothing is
expanded or converted before the budgets are checked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aios.config import schema as cfgmod
from aios.errors import ConfigError

BOMB = "a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n" + "".join(
    f"{n}: &{n} [{','.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)
)
FILES = {
    "bomb": (BOMB, "expands (through aliases) to more than"),
    "deep": ("x: " + "[" * 5000 + "]" * 5000 + "\n", "nests deeper than"),
    "deepmap": (
        "".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v\n",
        "nests deeper",
    ),
    "recursive": ("a: &a [*a]\n", "recursive alias"),
    "bigint": ("seed: " + "9" * 5000 + "\n", "integer of 5000 digits"),
    "mesh": ("mesh: {replicate: 0}\n", "'mesh.replicate'"),
}
OVERRIDES = {
    "mesh.dp=0": "invalid value 0 for 'mesh.dp'",
    "mesh.dp=-2": "invalid value -2 for 'mesh.dp'",
    "mesh.replicate=0": "invalid value 0 for 'mesh.replicate'",
    "seed=" + "9" * 5000: "integer of 5000 digits",
    "mesh.tp=" + "[" * 100 + "1" + "]" * 100: "nests deeper than",
}


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIOS_")}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )


def _one_line(r: subprocess.CompletedProcess[str], want: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and want in lines[0], (
        r.returncode,
        r.stderr[-2000:],
    )
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr


def _validate(*args: str) -> subprocess.CompletedProcess[str]:
    """``aios config validate ARGS`` in this process (click's runner): same code, no startup."""
    from aios.cli.main import cli
    from click.testing import CliRunner

    r = CliRunner().invoke(cli, ["config", "validate", *args])
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def _dry_run(capsys: pytest.CaptureFixture[str], *args: str) -> subprocess.CompletedProcess[str]:
    from aios.cli.run import main

    with pytest.raises(SystemExit) as ei:
        main(["--dry-run", *args])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, ei.value.code, out.out, out.err)


def test_bad_config_files_and_overrides_are_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in [k for k in os.environ if k.startswith("AIOS_")]:
        monkeypatch.delenv(k)
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    for name, (text, want) in FILES.items():
        f = tmp_path / f"{name}.yaml"
        f.write_text(text)
        _one_line(_validate("--config", str(f)), want)
        _one_line(_dry_run(capsys, "--config", str(f), str(script)), want)
    for override, want in OVERRIDES.items():
        _one_line(_validate(override), want)
        _one_line(_dry_run(capsys, override, str(script)), want)
    # and the real commands, in their own processes
    _one_line(
        _cli(
            tmp_path,
            "-c",
            "from aios.cli.main import main; main()",
            "config",
            "validate",
            "--config",
            str(tmp_path / "bomb.yaml"),
        ),
        FILES["bomb"][1],
    )
    _one_line(
        _cli(
            tmp_path,
            "-c",
            "from aios.cli.run import main; main()",
            "--dry-run",
            "mesh.dp=0",
            str(script),
        ),
        "'mesh.dp'",
    )


@pytest.mark.parametrize("name", ["bomb", "recursive", "bigint"])
def test_budgets_refuse_before_anything_is_built(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = []
    monkeypatch.setattr(yaml, "load", lambda *a, **k: built.append(1))
    with pytest.raises(ConfigError):
        cfgmod.parse_overrides([f"x={FILES[name][0].split(': ', 1)[1]}"]) if name == "bigint" else (
            cfgmod._parse_scalar(FILES[name][0])
        )
    assert built == []


def test_mesh_sizes_at_least_one_and_auto() -> None:
    assert cfgmod.resolve(None, ["mesh.dp=2", "mesh.replicate=auto"], {}, environ={}).mesh.dp == 2
    with pytest.raises(ConfigError, match="mesh.dp"):
        cfgmod.resolve(None, [], {}, environ={"AIOS_MESH__DP": "0"})
