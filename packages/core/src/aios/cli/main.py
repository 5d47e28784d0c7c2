"""``aios``: the command group. Subcommands load lazily so ``aios --help`` stays fast (no torch,
no pydantic, no plugin loading)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from aios.__about__ import __version__

# name -> (module, attribute, short help). Help text lives here so --help imports nothing.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plugins": ("aios.cli.info", "plugins", "List plugins: name, version, hooks, load errors."),
    "devices": ("aios.cli.info", "devices", "Show the devices each backend finds."),
    "env": ("aios.cli.info", "env", "Versions and settings for bug reports (secrets redacted)."),
    "doctor": ("aios.cli.info", "doctor", "Run health checks contributed by the backends."),
    "config": ("aios.cli.info", "config", "Show or validate the resolved config."),
    "run": ("aios.cli.run", "run_command", "Launch a training script (same as aios-run)."),
    "launch": ("aios.cli.cloud", "launch", "Provision cloud machines and run a script on them."),
    "status": ("aios.cli.cloud", "status", "Clusters and jobs with their state and recoveries."),
    "exec": ("aios.cli.cloud", "exec_", "Run a command on every host of a cluster."),
    "logs": ("aios.cli.cloud", "logs", "Show a cluster's job logs."),
    "ssh": ("aios.cli.cloud", "ssh", "Open a shell on one host of a cluster."),
    "sync": ("aios.cli.cloud", "sync", "Copy files between local paths, clusters and buckets."),
    "stop": ("aios.cli.cloud", "stop", "Stop a cluster (keeps its disks)."),
    "start": ("aios.cli.cloud", "start", "Start a stopped cluster."),
    "cancel": ("aios.cli.cloud", "cancel", "Cancel a cluster's running job (scancel on Slurm)."),
    "down": ("aios.cli.cloud", "down", "Delete a cluster and everything aios created for it."),
    "autostop": (
        "aios.cli.cloud",
        "autostop",
        "Stop or delete a cluster when it has been idle (agent on the cluster).",
    ),
    "catalog": (
        "aios.cli.cloud",
        "catalog",
        "Accelerators offered by the installed clouds, with prices.",
    ),
    "cost": ("aios.cli.cloud", "cost", "Estimate or rank the cost of a run across clouds."),
}


def debug_enabled() -> bool:
    return "--debug" in sys.argv or os.environ.get("AIOS_DEBUG", "") not in ("", "0")


def fail(exc: BaseException, prog: str = "aios") -> None:
    """Print one line for a user error and exit 2; a traceback only with --debug."""
    from aios.errors import AiosError

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
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            if debug_enabled():
                raise
            reason = str(exc)  # `exc` is unbound once the except block ends

            @click.command(name=name, help=COMMANDS[name][2])
            def missing() -> None:
                from aios.errors import AiosError

                raise AiosError(f"command '{name}' is unavailable: {reason}", "reinstall aios-core")

            return missing

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_) for name, (_, _, help_) in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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

    Train with `aios-run [--backend auto|cpu|cuda|xla|neuron] SCRIPT`.
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
