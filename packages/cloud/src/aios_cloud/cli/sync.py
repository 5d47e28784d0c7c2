"""``aios sync``: files between local paths, clusters and buckets."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
from aios.errors import AiosError

from aios_cloud import transfer
from aios_cloud.cli.common import _echo, _printer, _provider, _select, _store
from aios_cloud.jobs import job_env
from aios_cloud.request import JobSpec, parse_env

# ------------------------------------------------------------------------------ sync


def _host_python(rec: Any) -> str:
    """The interpreter of the cluster's latest job (it has aios shipped next to it), else the
    provider's default for the accelerator."""
    job = _store().latest_job(rec.name)
    if job and (job.spec or {}).get("python"):
        return job.spec["python"]
    try:
        return _provider(rec.cloud, None).python(rec.accelerator)
    except AiosError:
        return "python3"


def _classify(loc: str, store: Any) -> tuple[str, Any, str]:
    """``("url", scheme, url)``, ``("cluster", rec, path)`` or ``("local", None, path)``."""
    if "://" in loc:
        return "url", loc.split("://", 1)[0], loc
    m = re.match(r"^([a-z][-a-z0-9]*):(.*)$", loc)
    if m and store.get_cluster(m.group(1)):
        return "cluster", store.get_cluster(m.group(1)), m.group(2) or "."
    return "local", None, loc


@click.command()
@click.argument("src")
@click.argument("dst")
@click.option(
    "--worker",
    "-w",
    type=int,
    multiple=True,
    help="Cluster side: these workers (upload: default all; download: default 0).",
)
@click.option("--exclude", multiple=True)
@click.option(
    "--env",
    "env_items",
    multiple=True,
    help="Bucket <-> cluster: NAME=VALUE or NAME (forwarded from here) for the copy on the hosts "
    "(endpoints, credentials).",
)
@click.option("--dry-run", is_flag=True)
def sync(
    src: str,
    dst: str,
    worker: tuple[int, ...],
    exclude: tuple[str, ...],
    env_items: tuple[str, ...],
    dry_run: bool,
) -> None:
    """Copy between local paths, a cluster (NAME:PATH, relative to its code dir) and buckets
    (gs://..., s3://...). Bucket transfers show a progress bar for large files.

    \b
    aios sync ./data gs://bucket/data          local -> bucket
    aios sync gs://bucket/ckpt ./ckpt          bucket -> local
    aios sync ./config.yaml mycluster:configs/  local -> every host
    aios sync mycluster:out ./out -w 0          host 0 -> local
    aios sync gs://bucket/data mycluster:data   bucket -> every host (copied on the hosts)
    aios sync mycluster:out s3://bucket/out     host 0 -> bucket
    """

    store = _store()
    s = _classify(src, store)
    d = _classify(dst, store)
    if s[0] == "cluster" and d[0] == "cluster":
        raise AiosError(
            "copying between two clusters is not supported", "sync to a bucket first, then from it"
        )
    if s[0] == "local" and not Path(s[2]).exists():
        raise AiosError(f"source {src} does not exist", "pass an existing local path")
    if s[0] == "url" or d[0] == "url":
        if "cluster" in (s[0], d[0]):
            rec = s[1] if s[0] == "cluster" else d[1]
            if s[0] == "cluster" and len(worker) > 1:
                raise AiosError(
                    "cluster -> bucket copies from one worker (they would overwrite each other)",
                    "pass one -w N, and a different URL per worker",
                )
            env, forward = parse_env(list(env_items))
            env.update(job_env(JobSpec(script="", forward_env=forward), {}))
            hosts = _select(rec, worker or ((0,) if s[0] == "cluster" else ()))
            lines = transfer.bucket_cluster(
                s[2], d[2], rec, hosts, _host_python(rec), _printer(), dry_run, env, exclude
            )
        else:
            if env_items:
                raise AiosError("--env only applies to bucket <-> cluster copies", "drop --env")
            lines = transfer.copy_urls(s[2], d[2], dry_run=dry_run, excludes=exclude)
    elif s[0] == "local" and d[0] == "cluster":
        lines = transfer.upload_to_cluster(
            Path(s[2]), d[1], d[2], _select(d[1], worker), _printer(), dry_run, exclude
        )
    elif s[0] == "cluster" and d[0] == "local":
        hosts = _select(s[1], worker or (0,))
        lines = transfer.download_from_cluster(s[1], s[2], hosts, Path(d[2]), dry_run)
    else:
        raise AiosError(
            "both sides are local paths",
            "use cp/rsync, or name a cluster as NAME:PATH or a bucket URL",
        )
    for line in lines:
        _echo(line)
