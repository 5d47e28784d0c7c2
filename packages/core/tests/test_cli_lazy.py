"""The CLI's lazily imported commands: one whose module cannot be imported is one line."""

from __future__ import annotations

import aios.cli.main as cli_main
from click.testing import CliRunner


def test_a_command_whose_module_fails_to_import_is_one_line_naming_why(monkeypatch):
    monkeypatch.delenv("AIOS_DEBUG", raising=False)
    monkeypatch.setitem(
        cli_main.COMMANDS, "ghost", ("aios_no_such_module_xyz", "ghost", "A missing command.")
    )
    r = CliRunner().invoke(cli_main.cli, ["ghost"])
    assert r.exit_code == 2, r.output
    assert "command 'ghost' is unavailable: No module named 'aios_no_such_module_xyz'" in r.output
    assert "NameError" not in r.output and "Traceback" not in r.output
