"""``aios``: the command group. Subcommands load lazily so ``aios --help`` stays fast (no torch,
no pydantic, no plugin loading)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from aios.__about__ import __version__
from aios.errors import AiosError
from aios.plugins.install_hints import CLOUD_COMMANDS, CLOUD_INSTALL
from aios.plugins.registry import Registry
from aios.plugins.reserved import COMMANDS
from aios.types import load_target

_plugin_registry: Any = None


def plugin_commands() -> Any:
    """A registry holding only the plugins' commands (``aios_register_commands``): loading it
    imports the plugins' entry-point modules and nothing else (no pydantic, no torch)."""
    global _plugin_registry
    if _plugin_registry is None:
        _plugin_registry = Registry(commands_only=True)
    return _plugin_registry


def _broken(reg: Any) -> list[str]:
    """Plugins that failed to load (their commands, if any, are unknown)."""
    return sorted(
        {e.plugin for e in reg.errors if e.plugin not in reg.plugins or e.plugin in reg.dead}
    )


def _unavailable(name: str, help_: str, message: str, fix: str) -> click.Command:
    """A stand-in for a command that cannot load: accepts any arguments, exits 2 with one line."""

    @click.command(
        name=name,
        help=help_,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def missing(args: tuple[str, ...]) -> None:
        raise AiosError(message, fix)

    return missing


def debug_enabled() -> bool:
    return "--debug" in sys.argv or os.environ.get("AIOS_DEBUG", "") not in ("", "0")


def fail(exc: BaseException, prog: str = "aios") -> None:
    """Print one line for a user error and exit 2; a traceback only with --debug."""
    if debug_enabled():
        import traceback

        traceback.print_exception(type(exc), exc, exc.__traceback__)
    if isinstance(exc, AiosError):
        click.echo(f"{prog}: error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    click.echo(
        f"{prog}: error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
        err=True,
    )
    sys.exit(1)


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS) + sorted(plugin_commands().commands)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in COMMANDS:
            module, attr, help_ = COMMANDS[name]
            try:
                return getattr(importlib.import_module(module), attr)
            except ImportError as exc:
                if debug_enabled():
                    raise
                return _unavailable(
                    name, help_, f"command '{name}' is unavailable: {exc}", "reinstall aios-core"
                )
        return self._plugin_command(name)

    def _plugin_command(self, name: str) -> click.Command | None:
        reg = plugin_commands()
        spec = reg.commands.get(name)
        if spec is not None:
            try:
                cmd = load_target(spec.target)
                if not isinstance(cmd, click.Command):
                    raise TypeError(f"{spec.target} is a {type(cmd).__name__}, not a click command")
                return cmd
            except Exception as exc:
                if debug_enabled():
                    raise
                return _unavailable(
                    name,
                    spec.help,
                    f"command '{name}' of plugin \"{spec.plugin}\" failed to load: "
                    f"{type(exc).__name__}: {exc}",
                    f"reinstall {spec.plugin} from the aios checkout, or disable it with "
                    f"AIOS_DISABLE_PLUGINS={spec.plugin} (aios --debug shows the traceback)",
                )
        if name in CLOUD_COMMANDS:
            cloud = [
                e for e in reg.errors if e.plugin == "aios-cloud" and "aios-cloud" in _broken(reg)
            ]
            if cloud:
                return _unavailable(
                    name,
                    "",
                    f"'aios {name}' comes from the aios-cloud plugin, which failed to load: "
                    f"{cloud[0].error.splitlines()[0] if cloud[0].error else '?'}",
                    "reinstall it from the aios checkout: " + CLOUD_INSTALL,
                )
            return _unavailable(
                name,
                "",
                f"'aios {name}' is a cloud command and the aios-cloud package is not installed",
                "install it from the aios checkout: " + CLOUD_INSTALL,
            )
        return None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            reg = plugin_commands()
            broken = _broken(reg)
            if broken:  # the command may belong to a plugin that failed to load: name it
                raise AiosError(
                    f"no such command '{name}'; plugin(s) that failed to load and may provide it: "
                    + ", ".join(broken),
                    "`aios plugins` shows their errors",
                )
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
        reg = plugin_commands()
        by_plugin: dict[str, list[tuple[str, str]]] = {}
        for name, spec in reg.commands.items():
            by_plugin.setdefault(spec.plugin, []).append((name, spec.help))
        for plugin, prows in sorted(by_plugin.items()):
            with formatter.section(f"Commands from {plugin}"):
                formatter.write_dl(prows)
        broken = _broken(reg)
        if broken:
            with formatter.section("Plugins that failed to load (see `aios plugins`)"):
                formatter.write_dl([(p, "its commands are not available") for p in broken])
        if not any(n in reg.commands for n in CLOUD_COMMANDS):
            formatter.write_paragraph()
            formatter.write_text(
                "Cloud commands (launch, status, exec, ...): install aios-cloud: " + CLOUD_INSTALL
            )

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Exception as exc:  # noqa: BLE001
            fail(exc)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="aios")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def cli(debug: bool) -> None:
    """aios: one PyTorch training script on CPU, CUDA, Cloud TPU and Trainium,
    locally or on cloud machines.

    Train with `aios-run [--backend auto|cpu|cuda|tpu|xla|neuron] SCRIPT`.
    """
    if debug:
        os.environ["AIOS_DEBUG"] = "1"


def main() -> None:
    try:
        cli(standalone_mode=True)
    except click.exceptions.UsageError as exc:  # pragma: no cover - click exits itself
        exc.show()
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
