"""The ``dcp`` checkpoint format: sharded checkpoints through ``torch.distributed.checkpoint``.

Used by strategies whose state is sharded over ranks (``fsdp``, ``tp``, ``hsdp``: their
``checkpoint_format`` is ``"dcp"``); DDP, XLA and DeepSpeed keep the ``full`` format of
:mod:`aios.checkpoint`. Layout of one checkpoint (same directory naming and commit marker as the
full format, so listing, ``latest()``, pruning and ``aios`` tools treat both alike)::

    <dir>/ckpt-000000120/__0_0.distcp ...       DCP shards: every rank writes its own
    <dir>/ckpt-000000120/.metadata              DCP's global plan (written by rank 0)
    <dir>/ckpt-000000120/common.pt              state every rank holds alike (step, schedulers,
                                                registered objects, precision), from rank 0
    <dir>/ckpt-000000120/rank-00003.pt          per-rank state: RNG (python, numpy, torch,
                                                device), data position of every loader
    <dir>/ckpt-000000120/aios-checkpoint.json   commit marker, written LAST by rank 0

Rules:

* **Every rank writes its shards** to ``checkpoint.dir``: a local path (shared between nodes) or
  any fsspec URL (``gs://``, ``s3://``, ``memory://`` ...). Locally DCP's ``FileSystemWriter``
  (fsync'ed files); for URLs DCP's ``FsspecWriter``/``FsspecReader`` with the storage options
  the scheme's plugin registers.
* **A checkpoint counts only once committed.** Rank 0 writes the marker after DCP's save has
  finished on every rank (DCP gathers every rank's write results before rank 0 writes
  ``.metadata``; the per-rank files are written before a rank joins that save), listing every
  file with its size (and sha256 for the small ``.pt`` files). A directory without a marker (a
  rank died, the job was killed mid-save) is never resumed: ``latest()`` skips it and the next
  committed save prunes it.
* **Async.** :meth:`DcpCheckpointer.save` with ``async_save=True`` stages the state into CPU
  copies (DCP's stager) and returns; the writing runs in a background thread on a dedicated
  gloo process group so it never interleaves with training collectives, and rank 0 commits (marker,
  pruning) from that thread as soon as the write is done. :meth:`DcpCheckpointer.wait` finishes
  a pending save; call it (collectively) before the next save, at preemption and at exit.
* **Resharding on load.** Model and optimizer state go through
  ``torch.distributed.checkpoint.state_dict.get_state_dict/set_state_dict`` (FSDP2, DTensor TP,
  plain modules) and load in place into whatever sharding this run has: a checkpoint saved by N
  ranks loads on M ranks and on a different mesh.
* **Per-rank state on another world size** (:func:`rank_state_for`): rank ``r < N`` gets the
  saved state of rank ``r``; ranks ``r >= N`` have no saved RNG and are reseeded
  deterministically with :func:`reseed` from ``(seed, step, rank)``. Data positions are
  re-derived from the global sample count (:func:`reshard_loader_state`): after ``b`` batches
  per rank on N ranks, ``b * N`` per-rank batches of the same size were consumed globally, so the
  new position is ``b * N / M`` batches per rank. With the usual ``DistributedSampler``
  interleaving no sample is skipped or repeated when ``b * N`` divides by ``M``; otherwise the
  position rounds down (a few samples are seen twice, none skipped) and a warning says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from aios.checkpoint import MARKER, CheckpointInfo, CheckpointStore, ckpt_name
from aios.errors import CheckpointError

FORMAT_NAME = "dcp"
COMMON_FILE = "common.pt"
DCP_METADATA = ".metadata"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


# ------------------------------------------------------------------------------ storage


def storage_options(url: str) -> tuple[str, dict[str, Any]]:
    """``(fsspec URL, options)`` for a registered URL scheme (endpoint settings from the plugin
    that registers it; never credentials in the options it hands out)."""
    from aios.checkpoint import filesystem
    from aios.plugins import get_registry

    filesystem(url)  # the one-line errors for an unknown scheme or a missing package
    scheme, rest = url.split("://", 1)
    spec = get_registry().storage[scheme]
    options = spec.storage_options(url) if spec.storage_options else {}
    return f"{spec.protocol}://{rest}", options


def _make_writer(url: str) -> Any:
    """A DCP storage writer for one checkpoint directory (a local path or a URL)."""
    if "://" not in url:
        from torch.distributed.checkpoint import FileSystemWriter

        return FileSystemWriter(url, sync_files=True, single_file_per_rank=True, overwrite=True)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    full, options = storage_options(url)
    return FsspecWriter(full, sync_files=False, single_file_per_rank=True, overwrite=True, **options)


def _make_reader(url: str) -> Any:
    if "://" not in url:
        from torch.distributed.checkpoint import FileSystemReader

        return FileSystemReader(url)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    full, options = storage_options(url)
    return FsspecReader(full, **options)


def _torch_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ------------------------------------------------------------------------------ RNG and data


def rng_state(device_rng: dict[str, Any] | None = None) -> dict[str, Any]:
    """Python, NumPy, torch CPU (and the device's, when given) RNG states of this process."""
    import torch

    v, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [v, list(internal), gauss], "torch": torch.get_rng_state()}
    with contextlib.suppress(ImportError):
        import numpy as np

        s = np.random.get_state()
        state["numpy"] = [s[0], torch.from_numpy(s[1].astype("int64")), int(s[2]), int(s[3]), float(s[4])]
    state["device"] = device_rng or {}
    return state


def set_rng_state(state: dict[str, Any]) -> dict[str, Any]:
    """Restore what :func:`rng_state` captured; returns the device part for the caller."""
    import torch

    if "python" in state:
        v, internal, gauss = state["python"]
        random.setstate((v, tuple(internal), gauss))
    if "torch" in state:
        torch.set_rng_state(state["torch"])
    if "numpy" in state:
        with contextlib.suppress(ImportError):
            import numpy as np

            name, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((name, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    return state.get("device") or {}


def reseed_value(seed: int | None, step: int, rank: int) -> int:
    """The seed a rank without saved RNG state gets (documented rule, deterministic)."""
    h = hashlib.sha256(f"aios-dcp-reseed:{seed or 0}:{step}:{rank}".encode()).digest()
    return int.from_bytes(h[:8], "little") % 2**63


def reseed(seed: int | None, step: int, rank: int) -> int:
    """Seed Python, NumPy and torch for a rank beyond the saved world size; returns the seed
    (the caller seeds the device RNG with it too)."""
    import torch

    value = reseed_value(seed, step, rank)
    random.seed(value)
    with contextlib.suppress(ImportError):
        import numpy as np

        np.random.seed(value % 2**32)
    torch.manual_seed(value)
    return value


def reshard_loader_state(
    state: dict[str, Any] | None, saved_world: int, world: int,
    saved_batch_size: int | None = None, batch_size: int | None = None,
) -> dict[str, Any] | None:
    """A loader position ``{"epoch", "batch"}`` saved on ``saved_world`` ranks with per-rank
    batches of ``saved_batch_size`` samples, re-derived for ``world`` ranks with ``batch_size``
    (default: the same) from the global sample count (see the module docstring)."""
    if state is None or "batch" not in state:
        return state
    old_bs = int(saved_batch_size or batch_size or 1)
    new_bs = int(batch_size or old_bs)
    if saved_world == world and old_bs == new_bs:
        return state
    consumed = int(state["batch"]) * old_bs * saved_world  # samples consumed over all ranks
    batch, rest = divmod(consumed, new_bs * world)
    if rest:
        warnings.warn(
            f"aios: data position ({consumed} samples over {saved_world} ranks) does not divide into batches of "
            f"{new_bs} x {world} ranks: resuming at batch {batch}, {rest} samples are seen twice (none skipped)",
            stacklevel=2,
        )
    return {**state, "batch": batch}


def rank_state_for(rank: int, states: dict[int, Any]) -> Any | None:
    """The saved per-rank state this rank resumes with: its own when it existed, else None (the
    caller reseeds with :func:`reseed`)."""
    return states.get(rank)


# ------------------------------------------------------------------------------ the format


def _optimizer_owner(opt: Any, modules: list[Any]) -> Any:
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    for m in modules:
        if any(id(p) in ids for p in m.parameters()):
            return m
    raise CheckpointError("an optimizer holds parameters of no set-up model", "set up the model with the runtime before its optimizer")


def sharded_state(modules: list[Any], optimizers: list[Any]) -> dict[str, Any]:
    """``{"model.<i>": ..., "optim.<j>": ...}``: sharded (DTensor) state dicts, DCP's input."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out: dict[str, Any] = {}
    for i, m in enumerate(modules):
        out[f"model.{i}"] = get_state_dict(m, [])[0]
    for j, o in enumerate(optimizers):
        out[f"optim.{j}"] = get_state_dict(_optimizer_owner(o, modules), [o])[1]
    return out


def apply_sharded_state(state: dict[str, Any], modules: list[Any], optimizers: list[Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    for i, m in enumerate(modules):
        set_state_dict(m, [], model_state_dict=state[f"model.{i}"], optim_state_dict={})
    for j, o in enumerate(optimizers):
        owner = _optimizer_owner(o, modules)
        set_state_dict(owner, [o], model_state_dict={}, optim_state_dict=state[f"optim.{j}"])


@dataclass
class SaveHandle:
    """A save in flight (``async_save=True``) or done. :meth:`wait` is collective."""

    step: int
    path: str
    future: Any = None
    commit_thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None

    def done(self) -> bool:
        fut_done = self.future is None or self.future.done()
        return fut_done and (self.commit_thread is None or not self.commit_thread.is_alive())


class DcpCheckpointer:
    """Sharded checkpoints of one run under ``url`` (see the module docstring).

    Collective: every rank constructs it and calls :meth:`save`/:meth:`load`/:meth:`wait` at
    the same points. ``store`` is the :class:`aios.checkpoint.CheckpointStore` of the same
    directory (listing, ``latest()``, pruning, marker reading)."""

    def __init__(self, url: str, keep: int = 3, process_group: Any = None) -> None:
        self.url = url
        self.store = CheckpointStore(url, keep=keep)
        self._pg = process_group
        self._pg_made = process_group is not None
        self.pending: SaveHandle | None = None

    # ---------------------------------------------------------------- process group
    @staticmethod
    def _dist() -> tuple[bool, int, int]:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return True, dist.get_rank(), dist.get_world_size()
        return False, 0, 1

    def _group(self) -> Any:
        """A gloo group of all ranks just for checkpoint I/O (async saves run collectives from a
        background thread; they must not interleave with training's on the default group)."""
        if not self._pg_made:
            import torch.distributed as dist

            on, _, world = self._dist()
            self._pg = dist.new_group(backend="gloo") if on and world > 1 else None
            self._pg_made = True
        return self._pg

    def _path_url(self, step: int) -> tuple[str, str]:
        """(store path, URL or local path DCP writes to) of the checkpoint of ``step``."""
        path = self.store._join(ckpt_name(step))
        return path, (path if self.store.local else self.store.display(path))

    # ---------------------------------------------------------------- save
    def save(
        self,
        step: int,
        modules: list[Any],
        optimizers: list[Any],
        common: dict[str, Any],
        per_rank: dict[str, Any],
        meta: dict[str, Any] | None = None,
        async_save: bool = False,
    ) -> SaveHandle:
        """Write the checkpoint of ``step``. ``common``: state every rank holds alike (rank 0's
        copy is written); ``per_rank``: this rank's own state (RNG, data position). With
        ``async_save`` the call returns once the state is staged to CPU memory."""
        self.wait()  # one save at a time: the previous one is committed first
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        on, rank, world = self._dist()
        group = self._group()
        path, target = self._path_url(step)
        err: str | None = None
        if rank == 0:
            try:
                if self.store.fs.exists(path):  # re-saving a step: the old copy is no longer valid
                    self.store.fs.rm(path, recursive=True)
                self.store.fs.makedirs(path, exist_ok=True)
            except Exception as exc:  # noqa: BLE001
                err = f"{type(exc).__name__}: {exc}"
        if on and world > 1:
            box = [err]
            dist.broadcast_object_list(box, src=0, group=group)
            err = box[0]
        if err:
            raise CheckpointError(f"saving checkpoint to '{self.store.display(path)}' failed ({err})", "check that checkpoint.dir is writable and has free space")
        handle = SaveHandle(step=step, path=path)
        try:
            self._write_small(path, rank_file(rank), {"rank": rank, "world_size": world, "step": step, **per_rank})
            if rank == 0:
                self._write_small(path, COMMON_FILE, common)
            state = sharded_state(modules, optimizers)
            writer = _make_writer(target)
            if async_save:
                handle.future = dcp.async_save(state, storage_writer=writer, process_group=group, no_dist=not on)
                handle.future = getattr(handle.future, "upload_completion", handle.future)
            else:
                dcp.save(state, storage_writer=writer, process_group=group, no_dist=not on)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"saving checkpoint to '{self.store.display(path)}' failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''})",
                "check that checkpoint.dir is writable and has free space",
            ) from exc
        marker_meta = {"format_name": FORMAT_NAME, "world_size": world, **(meta or {})}
        if async_save:
            if rank == 0:
                handle.commit_thread = threading.Thread(target=self._commit_when_written, args=(handle, world, marker_meta), name="aios-dcp-commit", daemon=True)
                handle.commit_thread.start()
            self.pending = handle
            return handle
        commit_err: str | None = None
        if rank == 0:
            try:
                self._commit(handle, world, marker_meta)
            except Exception as exc:  # noqa: BLE001 - every rank raises it below
                commit_err = str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"
        if on and world > 1:
            box = [commit_err]
            dist.broadcast_object_list(box, src=0, group=group)
            commit_err = box[0]
        if commit_err:
            raise CheckpointError(f"committing checkpoint '{self.store.display(path)}' failed ({commit_err})", "check that checkpoint.dir is writable and has free space")
        handle.finished = time.perf_counter()
        return handle

    def _write_small(self, path: str, name: str, obj: Any) -> None:
        data = _torch_bytes(obj)
        p = f"{path}/{name}"
        if self.store.local:
            with open(p, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            with self.store.fs.open(p, "wb") as f:
                f.write(data)

    def _commit_when_written(self, handle: SaveHandle, world: int, meta: dict[str, Any]) -> None:
        try:
            handle.future.result()
            self._commit(handle, world, meta)
        except BaseException as exc:  # noqa: BLE001 - reported by wait()
            handle.error.append(exc)

    def _commit(self, handle: SaveHandle, world: int, meta: dict[str, Any]) -> None:
        """Rank 0, after every rank's shards are written: check they are all there, then write
        the marker (file list with sizes) last, then prune."""
        fs, path = self.store.fs, handle.path
        with contextlib.suppress(Exception):
            fs.invalidate_cache()
        entries = fs.ls(path, detail=True)
        files: dict[str, dict[str, Any]] = {}
        for e in entries:
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            if name == MARKER or e.get("type") == "directory":
                continue
            files[name] = {"size": int(e["size"])}
        need = [DCP_METADATA, COMMON_FILE, *(rank_file(r) for r in range(world))]
        missing = [n for n in need if n not in files]
        if missing or not any(n.endswith(".distcp") for n in files):
            raise CheckpointError(f"checkpoint '{self.store.display(path)}' is incomplete after the save: missing {', '.join(missing) or 'shards'}", "check the storage and rerun")
        for name in (COMMON_FILE, *(rank_file(r) for r in range(world))):
            with fs.open(f"{path}/{name}", "rb") as f:
                files[name]["sha256"] = hashlib.sha256(f.read()).hexdigest()
        marker = {"format": 1, "step": handle.step, "time": time.time(), "files": files, **meta}
        data = json.dumps(marker, indent=1, sort_keys=True).encode()
        if self.store.local:
            with open(f"{path}/{MARKER}", "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            with fs.open(f"{path}/{MARKER}", "wb") as f:
                f.write(data)
        handle.finished = time.perf_counter()
        self.store.prune()

    def wait(self) -> SaveHandle | None:
        """Finish the pending async save on every rank (collective); raises its error."""
        handle, self.pending = self.pending, None
        if handle is None:
            return None
        import torch.distributed as dist

        err: BaseException | None = None
        try:
            handle.future.result()
        except BaseException as exc:  # noqa: BLE001
            err = exc
        if handle.commit_thread is not None:
            handle.commit_thread.join()
            if handle.error and err is None:
                err = handle.error[0]
        on, _, world = self._dist()
        if on and world > 1:
            box = [None if err is None else f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"]
            # every rank learns whether the commit happened (rank 0 did it)
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, box[0], group=self._group())
            msgs = [m for m in gathered if m]
            if msgs and err is None:
                err = CheckpointError(msgs[0])
        if handle.finished is None:
            handle.finished = time.perf_counter()
        if err is not None:
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"saving checkpoint to '{self.store.display(handle.path)}' failed ({err})", "check that checkpoint.dir is writable and has free space") from err
        return handle

    # ---------------------------------------------------------------- load
    def load(
        self,
        info: CheckpointInfo,
        modules: list[Any],
        optimizers: list[Any],
    ) -> tuple[dict[str, Any], dict[int, Any], int]:
        """Load model and optimizer state in place, resharded to this run's layout. Returns
        ``(common, {saved rank: its per-rank state} for this rank's use, saved world size)``:
        only the entry of this rank is read (when that rank existed)."""
        import torch
        import torch.distributed.checkpoint as dcp

        if info.meta.get("format_name") != FORMAT_NAME:
            raise CheckpointError(
                f"checkpoint '{self.store.display(info.path)}' is not a sharded (dcp) checkpoint",
                "resume it with the strategy that saved it (full-format checkpoints load with ddp/deepspeed/xla)",
            )
        self.store.verify(info)
        on, rank, _ = self._dist()
        saved_world = int(info.meta.get("world_size", 1))
        fix = f"delete {self.store.display(info.path)} or start fresh with checkpoint.resume=false"
        try:
            common = torch.load(io.BytesIO(self.store.read_file(info, COMMON_FILE)), map_location="cpu", weights_only=True)
            per: dict[int, Any] = {}
            if rank < saved_world:
                per[rank] = torch.load(io.BytesIO(self.store.read_file(info, rank_file(rank))), map_location="cpu", weights_only=True)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"checkpoint '{self.store.display(info.path)}' cannot be loaded ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})", fix) from None
        target = info.path if self.store.local else self.store.display(info.path)
        state = sharded_state(modules, optimizers)
        try:
            dcp.load(state, storage_reader=_make_reader(target), process_group=self._group(), no_dist=not on)
            apply_sharded_state(state, modules, optimizers)
        except (RuntimeError, ValueError, KeyError, dcp.CheckpointException) as exc:
            first = str(exc).strip().splitlines()
            raise CheckpointError(
                f"the checkpoint does not fit this model/optimizer ({(first[0] if first else type(exc).__name__)[:200]})",
                "use the model definition that saved it, or start fresh with checkpoint.resume=false",
            ) from None
        return common, per, saved_world
