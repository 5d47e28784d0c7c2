"""Checkpoints: one package, one module per job.

* :mod:`aios.checkpoint.store`: the atomic, verifiable checkpoint directory on a local path or any
  fsspec URL (staging and commit, lineage, digests, pruning, the one-writer lock, resume's pick).
* :mod:`aios.checkpoint.manager`: what the runtime saves and when (formats, the batch-boundary
  save, periodic, emergency and named saves, resume).
* :mod:`aios.checkpoint.formats.dcp`: the ``dcp`` format (torch.distributed.checkpoint shards,
  resharding on load, background writes).
* :mod:`aios.checkpoint.state`: training state, what a checkpoint holds (separate from how and
  where it is written).
* :mod:`aios.checkpoint.files`: digests, hashed writes, the filesystem of a URL, the directory swap.
* :mod:`aios.checkpoint.lock`: the one-writer lock of a checkpoint directory.
* :mod:`aios.checkpoint.policy`: what a save costs (measured) and when to save: the periodic
  interval of ``checkpoint.max_lost``/``max_overhead``, whether an emergency save fits before a
  notice's deadline.
* :mod:`aios.checkpoint.writer`: the first thing DCP's checkpoint process runs (standard
  library only).

The names below are the public surface; import them from here. Nothing here imports torch.
"""

from __future__ import annotations

from aios.checkpoint.files import DIGEST, DIGESTS_FILE, filesystem
from aios.checkpoint.lock import LOCK_FENCE_S, LOCK_FILE, LOCK_HEARTBEAT_S, LOCK_STALE_S, fsync_dir
from aios.checkpoint.policy import (
    Interval,
    SaveCost,
    choose_interval,
    parse_duration,
    parse_fraction,
)
from aios.checkpoint.store import (
    MARKER,
    POINTER_SUFFIX,
    STATE_FILE,
    VERSION_SEP,
    CheckpointInfo,
    CheckpointStore,
    Staging,
    ckpt_name,
    new_lineage,
    open_any,
)

__all__ = [
    "DIGEST",
    "DIGESTS_FILE",
    "LOCK_FENCE_S",
    "LOCK_FILE",
    "LOCK_HEARTBEAT_S",
    "LOCK_STALE_S",
    "MARKER",
    "POINTER_SUFFIX",
    "STATE_FILE",
    "VERSION_SEP",
    "CheckpointInfo",
    "Interval",
    "SaveCost",
    "choose_interval",
    "parse_duration",
    "parse_fraction",
    "CheckpointStore",
    "Staging",
    "ckpt_name",
    "filesystem",
    "fsync_dir",
    "new_lineage",
    "open_any",
]
