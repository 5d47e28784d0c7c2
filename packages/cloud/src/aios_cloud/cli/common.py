"""What every cloud command shares: output, the config, the provider and store, host selection."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Any

import click
from aios.config.schema import resolve
from aios.errors import AiosError

from aios_cloud.provider.scheduler import SchedulerProvider
from aios_cloud.records import cloud_name, get_provider, installed_clouds, record_hosts
from aios_cloud.ssh import LinePrinter
from aios_cloud.store import Store

if TYPE_CHECKING:
    from aios_cloud.provider.base import Provider


CLOUD_HELP = "Cloud plugin to use (gcp, aws, ...); default: the only one installed."


# ------------------------------------------------------------------------------ helpers


def _echo(msg: str) -> None:
    click.echo(msg)


def _log(msg: str) -> None:
    click.echo(f"[aios] {msg}", err=True)


def _config(config_file: str | None) -> Any:
    return resolve(config_file=config_file, check_backend=False)


def _cloud_name(cloud: str | None, store_cloud: str | None = None) -> str:
    return cloud_name(cloud, store_cloud)


def _provider(cloud: str, config_file: str | None) -> Provider:
    return get_provider(cloud, _config(config_file))


def _store() -> Any:
    return Store()


def _printer() -> Any:
    return LinePrinter(sys.stdout)


def _emit_json(obj: Any) -> None:
    click.echo(json.dumps(obj, indent=2, default=str))


def _table(title: str, columns: list[str]) -> Any:
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def _print(obj: Any) -> None:
    from rich.console import Console

    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "0") or 0) or 220
    Console(soft_wrap=False, width=width).print(obj)


# ------------------------------------------------------------------------------ exec / logs / ssh


def _select(rec: Any, workers: tuple[int, ...]) -> list[Any]:
    hosts = record_hosts(rec)
    if not workers:
        return hosts
    ids = {h.worker_id for h in hosts}
    bad = [w for w in workers if w not in ids]
    if bad:
        raise AiosError(
            f"cluster {rec.name} has no worker {bad[0]} (workers: {', '.join(map(str, sorted(ids)))})",
            "pass a valid --worker",
        )
    return [h for h in hosts if h.worker_id in workers]


def _scheduler(rec: Any) -> SchedulerProvider | None:
    """The provider of a batch-scheduler record (Slurm, Kubernetes jobs have no SSH hosts), else None."""

    try:
        provider = _provider(rec.cloud, None)
    except AiosError:
        return None
    return provider if isinstance(provider, SchedulerProvider) else None


def _inventory_clouds(cloud: str | None) -> list[str]:
    return [cloud] if cloud else installed_clouds()
