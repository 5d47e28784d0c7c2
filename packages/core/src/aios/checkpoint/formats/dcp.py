"""The ``dcp`` checkpoint format: sharded checkpoints through ``torch.distributed.checkpoint``.

Used by strategies whose state is sharded over ranks (``fsdp``, ``tp``, ``hsdp``: their
``checkpoint_format`` is ``"dcp"``); DDP, XLA and DeepSpeed keep the ``full`` format of
:mod:`aios.checkpoint.store`. Layout of one checkpoint (same directory naming and commit marker as the
full format, so listing, ``latest()``, pruning and ``aios`` tools treat both alike)::

    <dir>/ckpt-000000120/__0_0.distcp ...       DCP shards: every rank writes its own
    <dir>/ckpt-000000120/.metadata              DCP's global plan (written by rank 0)
    <dir>/ckpt-000000120/aios-digests.json      size and digest of every shard and .metadata,
                                                hashed as they were written (rank 0's writer)
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
* **A checkpoint counts only once committed.** A save goes through the store's staging and
  commit (:meth:`aios.checkpoint.CheckpointStore.begin`/``commit``): rank 0 begins a staging
  directory (locally ``.aios-partial-ckpt-<step>-...``, renamed into place on commit; in place on
  object stores), every rank writes into it, and rank 0 writes the marker only after DCP's save
  has finished on every rank (DCP gathers every rank's write results before rank 0 writes
  ``.metadata``; the per-rank files are written before a rank joins that save). The marker lists
  every file with its size and digest: the shards and ``.metadata`` are hashed as DCP's writer
  writes them (in the checkpoint process or thread,
  :func:`aios.checkpoint.formats.dcp_io.digest_write_data`), and
  ``aios-digests.json`` carries those digests to the commit. On load every file is checked
  against its digest (shared out over the ranks) before torch reads any of it; a mismatch is a
  one-line "corrupt" error naming the file. A staging directory without
  a marker (a rank died, the job was killed mid-save) is never resumed, and the store's pruning
  removes it later (lineage rules of :mod:`aios.checkpoint.store`).
* **Async.** :meth:`DcpCheckpointer.save` with ``async_save=True`` stages the state into CPU
  copies (DCP's stager) and returns; rank 0 commits (marker, pruning) from a thread as soon as
  every rank's write is done. :meth:`DcpCheckpointer.wait` finishes a pending save; call it
  (collectively) before the next save, at preemption and at exit. The write runs (``async_mode``)
  either in DCP's **checkpoint process** (``"process"``, the default): the state is staged into
  shared CPU memory reused from save to save, and one daemon process per training process,
  started at the first background save with its own gloo group and a lower CPU/IO priority,
  serializes, writes and fsyncs the shards, so none of that holds the training process's GIL;
  or in a **thread** of the training process (``"thread"``, and always without
  ``torch.distributed``) on a dedicated gloo group so it never interleaves with training
  collectives.
* **Resharding on load.** Model and optimizer state go through
  ``torch.distributed.checkpoint.state_dict.get_state_dict/set_state_dict`` (FSDP2, DTensor TP,
  plain modules) and load in place into whatever sharding this run has: a checkpoint saved by N
  ranks loads on M ranks and on a different mesh.
* **Per-rank state on another world size** (:func:`rank_state_for`): rank ``r < N`` gets the
  saved random streams of rank ``r``; ranks ``r >= N`` have none and are reseeded
  deterministically with :func:`aios.data.rng.reseed` from ``(seed, step, rank)``
  (:meth:`aios.checkpoint.state.TrainingState.restore_rng`). Data positions are global
  (:mod:`aios.data.loaders`: samples of the epoch's order consumed by all ranks together), so a resumed
  run at any number of data-parallel ranks splits the rest of the epoch over its ranks with no
  sample skipped or repeated. An older checkpoint's per-rank batch count is turned into that
  global count (``batch x batch_size x saved data-parallel ranks``);
  :func:`aios.data.loaders.reshard_loader_state` is the per-rank rule for loaders of the library
  API that keep only a batch count.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import pickle
import shutil
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any

from aios.checkpoint.files import DIGEST, DIGESTS, DIGESTS_FILE, new_hash
from aios.checkpoint.formats.dcp_io import (
    DCP_METADATA,
    digest_finish,
    digest_write_data,
    quiet_checkpoint_process,
    storage_options,
)
from aios.checkpoint.formats.dcp_process import (
    ASYNC_MODES,
    checkpoint_process_alive,
    start_checkpoint_process,
    stop_checkpoint_process,
)
from aios.checkpoint.store import CheckpointInfo, CheckpointStore
from aios.data import rng
from aios.data.loaders import reshard_loader_state as reshard_loader_state
from aios.data.rng import reseed as reseed  # kept here under its 0.2 name
from aios.data.rng import reseed_value as reseed_value
from aios.errors import CheckpointError, os_cause, outcome, settle

FORMAT_NAME = "dcp"
COMMON_FILE = "common.pt"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


# ------------------------------------------------------------------------------ storage


_WRITERS: dict[str, type] = {}


def _writer_classes() -> tuple[type, type]:
    """DCP's local and fsspec writers: every file they write is hashed as it is written (see
    :func:`aios.checkpoint.formats.dcp_io.digest_write_data`); unpickled in the checkpoint
    process they quieten it. Built on first use (no torch import with this module); found
    again by pickle through the module ``__getattr__``."""
    if not _WRITERS:
        from torch.distributed.checkpoint import FileSystemWriter
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        def quiet(base: type, name: str) -> type:
            def __setstate__(self: Any, state: dict[str, Any]) -> None:  # noqa: N807
                self.__dict__.update(state)
                quiet_checkpoint_process()

            return type(
                name,
                (base,),
                {
                    "__setstate__": __setstate__,
                    "write_data": functools.partialmethod(digest_write_data, base),
                    "finish": functools.partialmethod(digest_finish, base),
                    "__module__": __name__,
                    "__qualname__": name,
                },
            )

        _WRITERS["_LocalWriter"] = quiet(FileSystemWriter, "_LocalWriter")
        _WRITERS["_UrlWriter"] = quiet(FsspecWriter, "_UrlWriter")
    return _WRITERS["_LocalWriter"], _WRITERS["_UrlWriter"]


def __getattr__(name: str) -> Any:
    if name in ("_LocalWriter", "_UrlWriter"):
        return dict(zip(("_LocalWriter", "_UrlWriter"), _writer_classes(), strict=True))[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _make_writer(url: str) -> Any:
    """A DCP storage writer for one checkpoint directory (a local path or a URL)."""
    local, remote = _writer_classes()
    if "://" not in url:
        return local(url, sync_files=True, single_file_per_rank=True, overwrite=True)
    full, options = storage_options(url)
    return remote(full, sync_files=False, single_file_per_rank=True, overwrite=True, **options)


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
    """Python, NumPy, torch CPU (and the device's, when given) RNG states of this process: the
    one capture, :func:`aios.data.rng.capture` (kept here under its 0.2 name)."""
    return rng.capture(device_rng)


def set_rng_state(state: dict[str, Any]) -> dict[str, Any]:
    """Restore what :func:`rng_state` captured; returns the device part for the caller: the one
    restore, :func:`aios.data.rng.restore` (kept here under its 0.2 name)."""
    return rng.restore(state)


def rank_state_for(rank: int, states: dict[int, Any]) -> Any | None:
    """The saved per-rank state this rank resumes with: its own when it existed, else None (the
    caller reseeds with :func:`aios.data.rng.reseed`)."""
    return states.get(rank)


# ------------------------------------------------------------------------------ model/optimizer


def _optimizer_owner(opt: Any, modules: list[Any]) -> Any:
    ids = {id(p) for g in opt.param_groups for p in g["params"]}
    for m in modules:
        if any(id(p) in ids for p in m.parameters()):
            return m
    raise CheckpointError(
        "an optimizer holds parameters of no set-up model",
        "set up the model with the runtime before its optimizer",
    )


def sharded_state(modules: list[Any], optimizers: list[Any]) -> dict[str, Any]:
    """``{"model.<i>": ..., "optim.<j>": ...}``: sharded (DTensor) state dicts, DCP's input."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    out: dict[str, Any] = {}
    for i, m in enumerate(modules):
        out[f"model.{i}"] = get_state_dict(m, [])[0]
    for j, o in enumerate(optimizers):
        out[f"optim.{j}"] = get_state_dict(_optimizer_owner(o, modules), [o])[1]
    return out


def apply_sharded_state(
    state: dict[str, Any], modules: list[Any], optimizers: list[Any], strict: bool = True
) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    opts = StateDictOptions(strict=strict)
    for i, m in enumerate(modules):
        set_state_dict(
            m, [], model_state_dict=state[f"model.{i}"], optim_state_dict={}, options=opts
        )
    for j, o in enumerate(optimizers):
        set_state_dict(
            _optimizer_owner(o, modules),
            [o],
            model_state_dict={},
            optim_state_dict=state[f"optim.{j}"],
            options=opts,
        )


def dist_info() -> tuple[bool, int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank(), dist.get_world_size()
    return False, 0, 1


def _unreadable_metadata(exc: BaseException) -> bool:
    """Whether DCP failed to unpickle ``.metadata`` (damaged bytes), anywhere in the chain or in
    any rank's failure."""
    todo: list[Any] = [exc]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if isinstance(e, tuple) and e:
            e = e[0]
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (pickle.UnpicklingError, UnicodeDecodeError, EOFError)):
            return True
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            todo.extend(failures.values())
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return False


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"


# ------------------------------------------------------------------------------ the writer


def _state_bytes(state: Any) -> int:
    """Bytes of this rank's tensors in a (sharded) state dict."""
    import torch

    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_state_bytes(v) for v in state)
    if isinstance(state, torch.Tensor):
        local = state.to_local() if hasattr(state, "to_local") else state
        return int(local.numel() * local.element_size())
    return 0


@dataclass
class SaveHandle:
    """One save; with ``async_save`` its shards are still being written in the background."""

    step: int
    staging: Any
    future: Any = None
    commit_thread: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)
    #: the committed checkpoint's path (rank 0, once committed)
    path: str | None = None
    started: float = field(default_factory=time.perf_counter)
    finished: float | None = None

    def done(self) -> bool:
        fut_done = self.future is None or self.future.done()
        return fut_done and (self.commit_thread is None or not self.commit_thread.is_alive())


class DcpWriter:
    """The I/O of the ``dcp`` format, shared by :class:`DcpCheckpointer` (library use) and
    :class:`DcpFormat` (the checkpoint manager's format). Holds the checkpoint process group and
    at most one pending save."""

    def __init__(self, process_group: Any = None, async_mode: str = "process") -> None:
        if async_mode not in ASYNC_MODES:
            raise CheckpointError(
                f"unknown async checkpoint mode {async_mode!r}",
                f"choose one of: {', '.join(ASYNC_MODES)}",
            )
        self._pg = process_group
        self._pg_made = process_group is not None
        self.pending: SaveHandle | None = None
        #: ``process``: a background save is written by DCP's checkpoint process (one per
        #: training process, started on the first background save, lowered CPU/IO priority);
        #: ``thread``: by a thread of the training process (DCP's default; GIL contention)
        self.async_mode = async_mode
        self._stager: Any = None

    def group(self) -> Any:
        """A gloo group of all ranks just for checkpoint I/O (an async save runs collectives
        from a background thread; they must not interleave with training's on the default
        group). Collective the first time."""
        if not self._pg_made:
            import torch.distributed as dist

            on, _, world = dist_info()
            self._pg = dist.new_group(backend="gloo") if on and world > 1 else None
            self._pg_made = True
        return self._pg

    # ---------------------------------------------------------------- collectives on the group
    def broadcast(self, obj: Any) -> Any:
        on, _, world = dist_info()
        if not on or world == 1:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.group())
        return box[0]

    def all_gather(self, obj: Any) -> list[Any]:
        on, _, world = dist_info()
        if not on or world == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * world
        dist.all_gather_object(out, obj, group=self.group())
        return out

    # ---------------------------------------------------------------- save
    def write_files(
        self,
        store: CheckpointStore,
        staging: Any,
        common: dict[str, Any] | None,
        per_rank: dict[str, Any],
    ) -> dict[str, Any]:
        """This rank's per-rank file (rank 0: also ``common``), durable; their marker entries."""
        import torch

        _, rank, world = dist_info()
        entries = {
            rank_file(rank): store.write_file(
                staging,
                rank_file(rank),
                lambda f: torch.save({"rank": rank, "world_size": world, **per_rank}, f),
            )
        }
        if common is not None:
            entries[COMMON_FILE] = store.write_file(
                staging, COMMON_FILE, lambda f: torch.save(common, f)
            )
        return entries

    def write_shards(
        self,
        store: CheckpointStore,
        staging: Any,
        modules: list[Any],
        optimizers: list[Any],
        async_save: bool,
    ) -> SaveHandle:
        """Every rank: its DCP shards into ``staging.path``; with ``async_save`` in the
        background (after the state is staged into CPU copies), on the checkpoint group. No other
        collective may run on that group until :meth:`wait`."""

        on, _, _ = dist_info()
        group = self.group()
        target = staging.path if store.local else store.display(staging.path)
        state = sharded_state(modules, optimizers)
        writer = _make_writer(target)
        handle = SaveHandle(step=staging.step, staging=staging)
        try:
            self._write(state, writer, group, on, handle, async_save)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            raise CheckpointError(
                f"saving checkpoint step {staging.step} failed ({os_cause(exc)})",
                "check that checkpoint.dir is writable and has free space",
            ) from exc
        return handle

    def _write(
        self, state: Any, writer: Any, group: Any, on: bool, handle: SaveHandle, async_save: bool
    ) -> None:
        import torch.distributed.checkpoint as dcp

        if async_save:
            kwargs: dict[str, Any] = {}
            if (
                self.async_mode == "process"
                and on
                and self._shm_fits(state)
                and self._checkpoint_processes_alive()
            ):
                kwargs = self._process_kwargs()
                if not kwargs:
                    self.async_mode = "thread"
            fut = dcp.async_save(
                state, storage_writer=writer, process_group=group, no_dist=not on, **kwargs
            )
            handle.future = getattr(fut, "upload_completion", fut)
            self.pending = handle
        else:
            dcp.save(state, storage_writer=writer, process_group=group, no_dist=not on)
            handle.finished = time.perf_counter()

    def _shm_fits(self, state: dict[str, Any]) -> bool:
        """Collective, before the first process-mode save: the staged copy lives in
        ``/dev/shm``; when it does not fit there on some rank (small container defaults), every
        rank warns and writes from a thread instead of failing mid-save (all ranks must use the
        same writer: their write collectives meet on its group)."""
        if self._stager is not None:
            return True  # the shared buffers exist and are reused
        need = _state_bytes(state)
        try:
            free = shutil.disk_usage("/dev/shm").free
        except OSError:  # no /dev/shm (not Linux): torch's shared memory lives elsewhere
            free = None
        short = [(n, f) for n, f in self.all_gather((need, free)) if f is not None and n * 1.1 > f]
        if not short:
            return True
        need, free = short[0]
        warnings.warn(
            f"aios: the background checkpoint needs {need / 2**20:.0f} MiB of shared memory but "
            f"/dev/shm has {free / 2**20:.0f} MiB free: writing from a thread of the training "
            "process instead (slower steps during the save); give the container more shared "
            "memory (e.g. docker run --shm-size) to write from the checkpoint process",
            stacklevel=3,
        )
        self.async_mode = "thread"
        return False

    def _checkpoint_processes_alive(self) -> bool:
        """Collective, before a process-mode save: when the checkpoint process of some rank
        has died (killed, out of memory), every rank warns and writes from a thread from now
        on (all ranks must use the same writer), instead of failing every later save."""
        if not any(a is False for a in self.all_gather(checkpoint_process_alive())):
            return True
        warnings.warn(
            "aios: DCP's checkpoint process died on some rank: background saves are written "
            "from a thread of the training process from now on (slower steps during a save)",
            stacklevel=3,
        )
        stop_checkpoint_process()
        self.async_mode = "thread"
        return False

    def _process_kwargs(self) -> dict[str, Any]:
        """``async_save`` arguments for the process-based writer: the state is staged once into
        shared CPU memory (buffers reused from save to save), so handing it to the checkpoint
        process pickles handles, never tensor bytes, and the serialization, file writes and
        fsync run outside the training process (no GIL contention with the training loop)."""
        import torch

        try:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

            start_checkpoint_process(self.group())
        except (ImportError, AttributeError, KeyError) as exc:  # same torch on every rank
            warnings.warn(
                f"aios: this torch {torch.__version__} has no usable DCP checkpoint process "
                f"({_one_line(exc)}): background saves are written from a thread",
                stacklevel=3,
            )
            return {}
        if self._stager is None:
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=torch.cuda.is_available(),
                    use_shared_memory=True,
                    use_async_staging=False,
                    use_non_blocking_copy=False,
                )
            )
        return {
            "async_checkpointer_type": AsyncCheckpointerType.PROCESS,
            "async_stager": self._stager,
        }

    @staticmethod
    def shard_entries(store: CheckpointStore, staging: Any) -> dict[str, Any]:
        """Rank 0, once the DCP save has finished on every rank: the shard files and DCP's
        metadata with the sizes and digests their writers recorded as they wrote them
        (:data:`aios.checkpoint.DIGESTS_FILE`), checked against what the store lists. An
        incomplete set is an error (never committed)."""
        fs = store.fs
        with contextlib.suppress(Exception):
            fs.invalidate_cache()
        files: dict[str, Any] = {}
        for e in fs.ls(staging.path, detail=True):
            name = str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            if name == DCP_METADATA or name.endswith(".distcp"):
                files[name] = {"size": int(e["size"])}
        if DCP_METADATA not in files or not any(n.endswith(".distcp") for n in files):
            raise CheckpointError(
                f"checkpoint step {staging.step} is incomplete after the save (no DCP shards or metadata)",
                "check the storage and rerun",
            )
        raw = store._read_json(f"{staging.path}/{DIGESTS_FILE}") or b""
        try:
            digests = json.loads(raw)
        except ValueError:
            digests = None
        for name, entry in files.items():
            got = digests.get(name) if isinstance(digests, dict) else None
            if not isinstance(got, dict) or got.get("size") != entry["size"]:
                raise CheckpointError(
                    f"checkpoint step {staging.step}: {name} does not match what its writer "
                    f"recorded in {DIGESTS_FILE} (written {got and got.get('size')} bytes, "
                    f"stored {entry['size']})",
                    "check the storage and rerun",
                )
            entry.update({k: got[k] for k in DIGESTS if got.get(k)})
        h = new_hash()
        h.update(raw)
        files[DIGESTS_FILE] = {"size": len(raw), DIGEST: h.hexdigest()}
        return files

    def commit_when_written(self, handle: SaveHandle, commit: Any, abort: Any) -> None:
        """Rank 0 of an async save: a thread that runs ``commit()`` (list the shards, write the
        marker; returns the path) once the background write has finished on every rank (DCP's
        rank 0 finishes only after gathering every rank's write results), or ``abort()``."""

        def run() -> None:
            try:
                handle.future.result()
                handle.path = commit()
                handle.finished = time.perf_counter()
            except BaseException as exc:  # noqa: BLE001 - reported by wait()
                handle.error.append(exc)
                with contextlib.suppress(Exception):
                    abort()

        handle.commit_thread = threading.Thread(target=run, name="aios-dcp-commit", daemon=True)
        handle.commit_thread.start()

    def wait(self) -> SaveHandle | None:
        """Collective: finish the pending async save (write and commit) on every rank; raises
        a :class:`CheckpointError` on every rank when it failed anywhere."""
        handle, self.pending = self.pending, None
        if handle is None:
            return None
        error: BaseException | None = None
        try:
            handle.future.result()
        except BaseException as exc:  # noqa: BLE001
            error = exc
        if handle.commit_thread is not None:
            handle.commit_thread.join()
            if handle.error and error is None:
                error = handle.error[0]
        outcomes = self.all_gather(outcome(error))
        if handle.finished is None:
            handle.finished = time.perf_counter()
        what = f"the background save of checkpoint step {handle.step}"
        settle(outcomes, dist_info()[1], error, what)  # one line, from the rank that failed
        return handle

    # ---------------------------------------------------------------- load
    def read(
        self,
        store: CheckpointStore,
        info: CheckpointInfo,
        modules: list[Any],
        optimizers: list[Any],
        strict: bool = True,
    ) -> tuple[dict[str, Any], dict[int, Any], int]:
        """Collective: load model and optimizer state in place, resharded to this run's layout.
        Returns ``(common, {saved rank: state} for this rank (empty when this rank did not
        exist at save time), saved world size)``."""
        import torch
        import torch.distributed.checkpoint as dcp

        if info.meta.get("checkpoint_format", info.meta.get("format_name")) != FORMAT_NAME:
            raise CheckpointError(
                f"checkpoint '{store.display(info.path)}' is not a sharded (dcp) checkpoint",
                "resume it with the strategy that saved it (full-format checkpoints load with ddp/deepspeed/xla)",
            )
        on, rank, world = dist_info()
        # every file against its digest before torch reads any of it: the files are shared out
        # over the ranks (each is read once), and every rank learns the first mismatch
        names = sorted(info.meta.get("files", {}))
        err: str | None = None
        try:
            store.verify(info, names=names[rank::world])
        except CheckpointError as exc:
            err = exc.one_line()
        errors = [e for e in self.all_gather(err) if e]
        if errors:
            raise CheckpointError(errors[0])
        saved_world = int(info.meta.get("world_size", 1))
        fix = f"delete {store.display(info.path)} or start fresh with checkpoint.resume=false"
        try:
            common = torch.load(
                io.BytesIO(store.read_file(info, COMMON_FILE)),
                map_location="cpu",
                weights_only=True,
            )
            per: dict[int, Any] = {}
            if rank < saved_world:
                per[rank] = torch.load(
                    io.BytesIO(store.read_file(info, rank_file(rank))),
                    map_location="cpu",
                    weights_only=True,
                )
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(
                f"checkpoint '{store.display(info.path)}' cannot be loaded ({_one_line(exc)})", fix
            ) from None
        target = info.path if store.local else store.display(info.path)
        state = sharded_state(modules, optimizers)
        try:
            dcp.load(
                state,
                storage_reader=_make_reader(target),
                process_group=self.group(),
                no_dist=not on,
            )
            apply_sharded_state(state, modules, optimizers, strict=strict)
        except (RuntimeError, ValueError, KeyError, EOFError, dcp.CheckpointException) as exc:
            if _unreadable_metadata(exc):
                raise CheckpointError(
                    f"checkpoint '{store.display(info.path)}' is corrupt: {DCP_METADATA} cannot "
                    "be read",
                    fix,
                ) from None
            raise CheckpointError(
                f"the checkpoint does not fit this model/optimizer ({_one_line(exc)})",
                "use the model definition that saved it, or start fresh with checkpoint.resume=false",
            ) from None
        return common, per, saved_world


# ------------------------------------------------------------------------------ library API


class DcpCheckpointer:
    """Sharded checkpoints of one run under ``url`` without the runtime (see the module
    docstring). Collective: every rank constructs it and calls :meth:`save`, :meth:`load` and
    :meth:`wait` at the same points. ``store`` is the :class:`aios.checkpoint.CheckpointStore`
    of the directory (listing, ``latest()``, pruning, staging and commit)."""

    def __init__(
        self,
        url: str,
        keep: int = 3,
        process_group: Any = None,
        lineage: str | None = None,
        async_mode: str = "process",
    ) -> None:
        self.url = url
        self.store = CheckpointStore(url, keep=keep, lineage=lineage)
        self.io = DcpWriter(process_group, async_mode=async_mode)

    @property
    def pending(self) -> SaveHandle | None:
        return self.io.pending

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
        ``async_save`` the call returns once the state is staged into CPU memory; rank 0
        commits in the background when every rank's shards are written."""
        self.io.wait()  # one save at a time: the previous one is committed first
        on, rank, world = dist_info()
        store = self.store
        staging, err = None, None
        if rank == 0:
            try:
                staging = store.begin(step)
            except CheckpointError as exc:
                err = exc.one_line()
        staging, err = self.io.broadcast((staging, err))
        if err:
            raise CheckpointError(err)
        entries: dict[str, Any] = {}
        try:
            entries = self.io.write_files(store, staging, common if rank == 0 else None, per_rank)
            err = None
        except Exception as exc:  # noqa: BLE001 - every rank learns it below
            err = os_cause(exc)
        results = self.io.all_gather((entries, err))  # before the shards: none may overlap them
        failed = [e for _, e in results if e]
        files: dict[str, Any] = {}
        for f, _ in results:
            files.update(f)
        marker = {"checkpoint_format": FORMAT_NAME, "world_size": world, **(meta or {})}
        if failed:
            if rank == 0:
                store.abort(staging)
            raise CheckpointError(
                f"saving checkpoint step {step} failed ({failed[0]})",
                "check that checkpoint.dir is writable and has free space",
            )
        try:
            handle = self.io.write_shards(store, staging, modules, optimizers, async_save)
        except Exception as exc:
            if rank == 0:
                store.abort(staging)
            raise CheckpointError(
                f"saving checkpoint step {step} failed ({os_cause(exc)})",
                "check that checkpoint.dir is writable and has free space",
            ) from exc

        def commit() -> str:
            return store.commit(staging, marker, {**files, **self.io.shard_entries(store, staging)})

        if async_save:
            if rank == 0:
                self.io.commit_when_written(handle, commit, lambda: store.abort(staging))
            return handle
        err = None
        if rank == 0:
            try:
                handle.path = commit()
            except Exception as exc:  # noqa: BLE001
                err = os_cause(exc)
        err = self.io.broadcast(err)
        if err:
            raise CheckpointError(
                f"committing checkpoint step {step} failed ({err})",
                "check that checkpoint.dir is writable and has free space",
            )
        return handle

    def wait(self) -> SaveHandle | None:
        return self.io.wait()

    def load(
        self, info: CheckpointInfo, modules: list[Any], optimizers: list[Any], strict: bool = True
    ) -> tuple[dict[str, Any], dict[int, Any], int]:
        return self.io.read(self.store, info, modules, optimizers, strict)
