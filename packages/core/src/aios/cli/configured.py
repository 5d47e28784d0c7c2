"""``aios doctor|config``: the commands that read a config file (the config schema, pydantic
and yaml load with them; ``aios plugins|devices|env`` do without). No torch import."""

from __future__ import annotations

import sys
from typing import Any

import click

from aios.cli.info import _console, _emit_json, _registry
from aios.config.schema import resolve
from aios.types import DoctorCheck

# ------------------------------------------------------------------------------ doctor


@click.command()
@click.option("--backend", default=None, help="Only checks for this backend.")
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML config file.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def doctor(backend: str | None, config_file: str | None, as_json: bool) -> None:
    """Run pass/warn/fail checks contributed by the backends, each with its fix.
    Exits 1 when a check fails."""
    reg = _registry()
    if backend:
        reg.backend(backend)
    cfg = None
    if config_file:
        cfg = resolve(config_file)
    checks: list[DoctorCheck] = []
    for err in reg.errors:
        checks.append(
            DoctorCheck(
                "plugin loads",
                "fail",
                f'"{err.plugin}": {err.error}',
                "reinstall or disable it (AIOS_DISABLE_PLUGINS)",
                plugin=err.plugin,
            )
        )
    for plugin, result, exc in reg.call_all("aios_doctor_checks", backend=backend, config=cfg):
        if exc is not None:
            checks.append(
                DoctorCheck(
                    "doctor hook",
                    "fail",
                    f'"{plugin}" raised {type(exc).__name__}: {exc}',
                    "report this to the plugin's authors",
                    plugin=plugin,
                )
            )
        for c in result or []:
            checks.append(c if c.plugin else _set_plugin(c, plugin))
    if as_json:
        _emit_json([c.__dict__ for c in checks])
    else:
        from rich.markup import escape

        style = {
            "pass": "[green]PASS[/green]",
            "warn": "[yellow]WARN[/yellow]",
            "fail": "[red]FAIL[/red]",
        }
        con = _console()
        for c in checks:
            fix = f"\n       fix: {c.fix}" if c.fix and c.status != "pass" else ""
            scope = f"[{c.backend}] " if c.backend else ""
            con.print(
                f"{style[c.status]} " + escape(f"{scope}{c.name}: {c.message}{fix}"),
                highlight=False,
            )
    if any(c.status == "fail" for c in checks):
        sys.exit(1)


def _set_plugin(c: Any, plugin: str) -> Any:
    import dataclasses

    return dataclasses.replace(c, plugin=plugin)


# ------------------------------------------------------------------------------ config


@click.group()
def config() -> None:
    """Show or validate the resolved config (file < AIOS_* env < key=value < flags)."""


@config.command("show")
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML config file.",
)
@click.option("--json", "as_json", is_flag=True)
@click.argument("overrides", nargs=-1)
def config_show(config_file: str | None, as_json: bool, overrides: tuple[str, ...]) -> None:
    """Print the resolved config (secrets redacted)."""
    cfg = resolve(config_file, list(overrides))
    data = cfg.redacted_dict()
    if as_json:
        _emit_json(data)
    else:
        import yaml

        click.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


@config.command("validate")
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML config file.",
)
@click.argument("overrides", nargs=-1)
def config_validate(config_file: str | None, overrides: tuple[str, ...]) -> None:
    """Validate; exit 2 with one line naming the bad key when invalid."""
    resolve(config_file, list(overrides))
    click.echo("config ok")
