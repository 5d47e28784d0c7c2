"""The storage side of the ``dcp`` format: the fsspec URL and options of a registered scheme
(:func:`storage_options`), the shards and DCP's ``.metadata`` hashed as DCP's writer writes them
(:func:`digest_write_data`, :func:`digest_finish`: the digests reach the commit marker through
``aios-digests.json``), and DCP's checkpoint process kept quiet
(:func:`quiet_checkpoint_process`)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from typing import Any

from aios.checkpoint.files import DIGESTS_FILE, HashingWriter, filesystem
from aios.plugins.registry import get_registry

DCP_METADATA = ".metadata"


def storage_options(url: str) -> tuple[str, dict[str, Any]]:
    """``(fsspec URL, options)`` for a registered URL scheme (endpoint settings from the plugin
    that registers it; never credentials in the options it hands out)."""
    filesystem(url)  # the one-line errors for an unknown scheme or a missing package
    scheme, rest = url.split("://", 1)
    spec = get_registry().storage[scheme]
    options = spec.storage_options(url) if spec.storage_options else {}
    return f"{spec.protocol}://{rest}", options


class _RelayedFailures:
    """A logging filter for DCP's checkpoint process: drops its "Checkpoint save failed ..." and
    "... failed during initialization" records. Their text is every rank's traceback
    (``Traceback (most recent call last): (RANK 0)``, ``OSError: [Errno 28] ...``); the same
    exception is sent back to the training process, where aios reports it in one line."""

    PREFIXES = ("Checkpoint save failed", "Checkpoint background process failed")

    def filter(self, record: Any) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        return not msg.startswith(self.PREFIXES)


def quiet_checkpoint_process() -> None:
    """In DCP's checkpoint process (``async_mode="process"``), where torch sets the root logger
    to INFO and logs every request to stderr: keep warnings and errors only, and not the
    failures it relays to the training process (:class:`_RelayedFailures`)."""
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    root.addFilter(_RelayedFailures())


#: fqn prefix of the extra write results that carry a shard's digest to rank 0's ``finish``
_DIGEST_FQN = "aios.digest:"


def _hashed_streams(fs: Any, digests: dict[str, Any], errors: list[OSError]) -> Any:
    """``fs.create_stream`` wrapped so that every file written through it is hashed as it is
    written (its size and digest land in ``digests`` under the file's name) and the OS error of a
    failed write is kept (torch's zip writer replaces it with its own message)."""
    create = fs.create_stream

    @contextlib.contextmanager
    def create_stream(path: Any, mode: str) -> Any:
        if "w" not in mode:
            with create(path, mode) as stream:
                yield stream
            return
        w: HashingWriter | None = None
        try:
            with create(path, mode) as stream:
                w = HashingWriter(stream)
                yield w
        except Exception:
            if w is not None and w.error is not None:
                errors.append(w.error)
            raise
        digests[str(path).replace("\\", "/").rsplit("/", 1)[-1]] = w.entry()

    return create_stream


def digest_write_data(self: Any, base: Any, plan: Any, planner: Any) -> Any:
    """This rank's shards, hashed as they are written (in the checkpoint process or the writer
    thread: the asynchronous part of the save); the digests travel to rank 0's ``finish`` as
    extra write results."""
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.storage import WriteResult
    from torch.futures import Future

    digests: dict[str, Any] = {}
    errors: list[OSError] = []
    self.fs.create_stream = _hashed_streams(self.fs, digests, errors)
    try:
        results = list(base.write_data(self, plan, planner).wait())
    except Exception as exc:
        if errors:
            raise errors[0] from exc  # the OS's word ("No space left on device")
        raise
    finally:
        del self.fs.create_stream
    for name, entry in digests.items():
        index = MetadataIndex(f"{_DIGEST_FQN}{name}")
        results.append(WriteResult(index=index, size_in_bytes=0, storage_data=entry))
    fut: Future[list[Any]] = Future()
    fut.set_result(results)
    return fut


def digest_finish(self: Any, base: Any, metadata: Any, results: list[list[Any]]) -> None:
    """Rank 0: DCP's ``.metadata`` (hashed as it is written) and, before the marker can be,
    :data:`aios.checkpoint.DIGESTS_FILE` with every shard's and the metadata's size and digest."""
    digests: dict[str, Any] = {}
    kept: list[list[Any]] = []
    for wrs in results:
        kept.append([])
        for wr in wrs:
            fqn = str(getattr(wr.index, "fqn", ""))
            if fqn.startswith(_DIGEST_FQN):
                digests[fqn[len(_DIGEST_FQN) :]] = wr.storage_data
            else:
                kept[-1].append(wr)
    meta: dict[str, Any] = {}
    errors: list[OSError] = []
    self.fs.create_stream = _hashed_streams(self.fs, meta, errors)
    try:
        base.finish(self, metadata, kept)
    except Exception as exc:
        if errors:
            raise errors[0] from exc
        raise
    finally:
        del self.fs.create_stream
    for name, entry in meta.items():  # written as ".metadata.tmp", then renamed
        if name.startswith(DCP_METADATA):
            digests[DCP_METADATA] = entry
    path = self.fs.concat_path(self.path, DIGESTS_FILE)
    with self.fs.create_stream(path, "wb") as f:
        f.write(json.dumps(digests, sort_keys=True).encode())
        if self.sync_files:
            with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
                f.flush()
                os.fsync(f.fileno())
