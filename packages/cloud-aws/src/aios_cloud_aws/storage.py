"""S3 through fsspec/s3fs: the ``s3://`` scheme for checkpoints, data and ``aios sync``, and a
copy helper with a progress bar.

Credentials are never passed as options: s3fs (aiobotocore) finds them through the same chain as
boto3 (env, profile, SSO, the instance profile on the hosts). Only the endpoint is taken from
the environment (``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``), which is how tests reach moto.
"""

from __future__ import annotations

import os
from typing import Any


def storage_options(url: str = "") -> dict[str, Any]:
    """fsspec options for an ``s3://`` URL: endpoint and region from the environment, no secrets."""
    opts: dict[str, Any] = {}
    client_kwargs: dict[str, Any] = {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["endpoint_url"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        client_kwargs["region_name"] = region
    if client_kwargs:
        opts["client_kwargs"] = client_kwargs
    return opts


def filesystem() -> Any:
    import fsspec

    return fsspec.filesystem("s3", **storage_options())


class RichProgress:
    """An fsspec callback drawing one rich progress bar per transfer (bytes)."""

    def __init__(self, description: str, enabled: bool = True) -> None:
        from fsspec.callbacks import Callback

        self.enabled = enabled
        self.description = description
        outer = self

        class _Cb(Callback):
            def call(self, *args: Any, **kwargs: Any) -> None:
                outer._update(self.value, self.size)

            def branched(self, path_1: str, path_2: str, **kwargs: Any) -> Any:
                return _Cb()

        self.callback = _Cb()
        self._progress: Any = None
        self._task: Any = None
        self.last: tuple[int, int | None] = (0, None)

    def _update(self, value: int, size: int | None) -> None:
        self.last = (value, size)
        if not self.enabled:
            return
        if self._progress is None:
            from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

            self._progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=size)
        self._progress.update(self._task, completed=value, total=size)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def copy(src: str, dst: str, progress: bool = True, recursive: bool = True) -> int:
    """Copy between a local path and ``s3://`` (either direction), or S3 to S3, with a
    progress bar. Returns the bytes copied."""
    import fsspec

    src_remote, dst_remote = src.startswith("s3://"), dst.startswith("s3://")
    fs = fsspec.filesystem("s3", **storage_options())
    total = 0
    if src_remote:
        total = sum(
            info.get("size", 0)
            for info in (
                fs.find(src, detail=True).values()
                if recursive and fs.isdir(src)
                else [fs.info(src)]
            )
        )
    else:
        local = fsspec.filesystem("file")
        total = sum(
            info.get("size", 0)
            for info in (
                local.find(src, detail=True).values() if os.path.isdir(src) else [local.info(src)]
            )
        )
    bar = RichProgress(f"{src} -> {dst}", enabled=progress)
    try:
        if src_remote and dst_remote:
            fs.copy(src, dst, recursive=recursive)
        elif src_remote:
            fs.get(src, dst, recursive=recursive, callback=bar.callback)
        elif dst_remote:
            fs.put(src, dst, recursive=recursive, callback=bar.callback)
        else:
            raise ValueError("copy needs an s3:// source or destination")
    finally:
        bar.close()
    return total
