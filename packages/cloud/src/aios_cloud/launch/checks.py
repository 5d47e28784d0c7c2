"""The launch's own checks: the cluster name, checkpoints, autostop, the checkpoint bucket."""

from __future__ import annotations

import getpass
import random
import re

from aios.checkpoint import filesystem
from aios.errors import AiosError

from aios_cloud.provider.base import CloudProvider
from aios_cloud.provider.data import ClusterRequest
from aios_cloud.request import LaunchRequest

NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,46}[a-z0-9])?$")


def check_checkpoints(request: LaunchRequest, provider: CloudProvider) -> None:
    """A managed run needs a checkpoint directory that outlives the hosts, which they can write."""
    ckpt = request.checkpoint_dir
    bucket = f"{provider.storage_scheme or 'gs'}://BUCKET/PATH"
    if request.managed and not ckpt:
        raise AiosError(
            "--max-restarts needs --checkpoint-dir on a bucket, so a recreated cluster can resume",
            f"add --checkpoint-dir {bucket}",
        )
    if ckpt and request.managed and "://" not in ckpt and not provider.shared_paths:
        raise AiosError(
            f"--checkpoint-dir {ckpt} is local to the hosts and dies with them",
            f"use a bucket URL such as {bucket}",
        )
    if ckpt and "://" in ckpt:  # the hosts must be able to write there
        provider.check_storage(ckpt, {*request.env, *request.forward_env})


def check_autostop(provider: CloudProvider, cluster: ClusterRequest, autodown: bool) -> None:
    """Before anything is created: a plain ``--autostop`` (stop when idle) on capacity that
    cannot be stopped would leave it billing; offer ``--autodown`` instead."""
    why = None if autodown else provider.stop_refusal(cluster.spot, cluster.accelerator)
    if why:
        raise AiosError(
            f"--autostop stops the cluster when idle, but {why}",
            "use --autostop N --autodown (delete it when idle)",
        )


def check_bucket(url: str) -> None:
    """The checkpoint bucket must exist (a managed run writes there from every host)."""
    fs, path = filesystem(url)
    bucket = path.split("/", 1)[0]
    try:
        ok = fs.exists(bucket)
    except Exception as exc:  # noqa: BLE001 - credentials, network: one line
        raise AiosError(
            f"cannot check bucket {url.split('://')[0]}://{bucket}: {type(exc).__name__}: "
            f"{str(exc)[:160]}",
            "check your credentials and the bucket name",
        ) from None
    if not ok:
        scheme = url.split("://")[0]
        hint = (
            f"gcloud storage buckets create gs://{bucket}"
            if scheme == "gs"
            else (f"aws s3 mb s3://{bucket}" if scheme == "s3" else f"create the bucket {bucket}")
        )
        raise AiosError(
            f"bucket {scheme}://{bucket} not found", f"create it ({hint}) or fix --checkpoint-dir"
        )


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise AiosError(
            f"cluster name '{name}' is invalid",
            "use 1-48 lowercase letters, digits and dashes, starting with a letter",
        )
    return name


def default_name() -> str:
    """``aios-USER-XXXX``."""
    user = re.sub("[^a-z0-9]", "", getpass.getuser().lower())[:12] or "user"
    return f"aios-{user}-{random.randint(0, 0xFFFF):04x}"
