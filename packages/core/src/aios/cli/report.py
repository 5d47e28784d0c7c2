"""``aios report RUN_DIR|CHECKPOINT_DIR|CLUSTER [--json] [--html FILE]``: what a run's wall time
went to, over every attempt (goodput and badput by cause, interruptions listed). Imports no
torch (:mod:`aios.runrecord.goodput`)."""

from __future__ import annotations

import contextlib
import json
import os

import click

from aios.errors import AiosError
from aios.ft import report as ft_report
from aios.plugins.registry import get_registry
from aios.runrecord import goodput, render


def _resolve(target: str) -> str:
    """A run record or checkpoint directory from TARGET; a name that is neither may be a
    cluster a plugin knows (``aios_report_target``)."""
    if os.path.exists(target) or "://" in target:
        return target

    for plugin, result, exc in get_registry().call_all("aios_report_target", target=target):
        if isinstance(exc, AiosError):
            raise exc  # the plugin knows the name and says what is missing, in one line
        if exc is not None:
            click.echo(f"aios: plugin {plugin!r} failed to resolve '{target}': {exc}", err=True)
        elif result:
            return str(result)
    raise AiosError(
        f"'{target}' is no run record, checkpoint directory or known cluster",
        "pass logging.run_dir/<run id>, checkpoint.dir, or the name of a cluster you launched",
    )


@click.command(name="report")
@click.argument("target")
@click.option("--json", "as_json", is_flag=True, help="The account as JSON (for tools).")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write one self-contained page with the timeline drawn.",
)
def report(target: str, as_json: bool, html_file: str | None) -> None:
    """Goodput: what the run's wall time went to, over every attempt.

    TARGET: a run record (runs/<run-id>), a checkpoint directory (the newest run that wrote or
    resumed its newest checkpoint, followed back through every resume), or a cluster name (with
    aios-cloud). A run that follows one that finished is a separate run, not an interruption:
    the idle time between them is not counted.
    """
    try:
        r = goodput.report_for(_resolve(target))
    except ValueError as exc:
        raise AiosError(str(exc).split(": pass")[0], "pass the run record directory") from None
    if not r.attempts:
        raise AiosError(f"no attempt recorded in '{target}'", "pass a run record directory")
    if html_file:
        tmp = f"{html_file}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                f.write(
                    render.render_html(r, f"aios run {os.path.basename(r.attempts[-1].run_dir)}")
                )
            os.replace(tmp, html_file)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise AiosError(
                f"cannot write '{html_file}' ({exc.strerror})", "pick a writable path"
            ) from None
    ft = ft_report.summarize(r.attempts[-1].run_dir)
    if as_json:
        click.echo(json.dumps({**r.to_dict(), **({"ft": ft} if ft else {})}, indent=1))
        return
    for line in render.render_text(r):
        click.echo(line)
    for line in ft_report.lines(ft) if ft else []:
        click.echo(line)
    if html_file:
        click.echo(f"timeline: {html_file}")
