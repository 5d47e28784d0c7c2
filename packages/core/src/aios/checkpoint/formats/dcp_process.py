"""Where a ``dcp`` background save is written: the modes (:data:`ASYNC_MODES`), the one
``checkpoint.async_writer=auto`` picks for a device (:func:`resolve_async_mode`), and DCP's
checkpoint process of a training process: started once without running the training script
again in it, shielded from a preemption SIGTERM, stopped at exit."""

from __future__ import annotations

import contextlib
import importlib.machinery
import multiprocessing.util
import os
import sys
from typing import Any

from aios.checkpoint.writer import ShieldedTarget

#: how a background save is written (:class:`DcpWriter`'s ``async_mode``)
ASYNC_MODES = ("process", "thread")
#: devices whose background saves DCP's checkpoint process writes under
#: ``checkpoint.async_writer=auto``: cpu (tested here) and cuda (the device PyTorch built the
#: process executor for; the state reaches it staged to host memory). TorchTPU/TorchNeuron workers
#: use the thread until the process is run on them: it would import torch, and the device plugin
#: the worker's environment autoloads, a second time on the host
PROCESS_WRITER_DEVICES = ("cpu", "cuda")


def resolve_async_mode(setting: str, device_type: str | None) -> str:
    """``checkpoint.async_writer`` for a run on ``device_type``: ``auto`` is the checkpoint
    process on :data:`PROCESS_WRITER_DEVICES`, the thread elsewhere."""
    if setting != "auto":
        return setting
    return "process" if device_type in PROCESS_WRITER_DEVICES else "thread"


@contextlib.contextmanager
def _main_not_rerun() -> Any:
    """While a ``spawn`` child starts: make ``multiprocessing`` skip re-running the training
    script in it (scripts need no ``if __name__ == "__main__"`` guard for aios)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    had, old = hasattr(main, "__spec__"), getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)  # spawn: nothing to import
    try:
        yield
    finally:
        if had:
            main.__spec__ = old
        else:
            del main.__spec__


def start_checkpoint_process(group: Any) -> None:
    """Collective, at the first process-mode save: start DCP's checkpoint process of this rank
    (once per training process) now, on this thread, so that the training script is not run
    again in it, at a lower CPU/IO priority. Blocks until every rank's process has joined its
    gloo group (once; seconds)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    if ape._CHECKPOINT_PROCESS is not None:
        return
    info = ape._ProcessGroupInitInfo(group)
    # The process's target is read from this class attribute when it is constructed: ours
    # shields the process from a preemption SIGTERM sent to the whole process group (it must
    # finish the pending save) and ties its life to this process (aios.checkpoint.writer). The
    # training process stops it (below) once that save and the emergency one are done.
    cls = ape._AsyncCheckpointProcess
    original = cls.__dict__["_checkpointing_subprocess"]
    cls._checkpointing_subprocess = ShieldedTarget(os.getpid())  # type: ignore[method-assign]
    try:
        with _main_not_rerun():
            ape._CHECKPOINT_PROCESS = cls(pg_init_info=info)
    finally:
        cls._checkpointing_subprocess = original  # type: ignore[method-assign]
    # before multiprocessing's exit handler (main process and multiprocessing children alike),
    # which SIGTERMs daemon children and joins them (the shielded process ignores SIGTERM)
    multiprocessing.util.Finalize(None, stop_checkpoint_process, exitpriority=100)


def checkpoint_process_alive() -> bool | None:
    """Whether this rank's checkpoint process runs (None: none was started)."""
    ape = sys.modules.get("torch.distributed.checkpoint._async_process_executor")
    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is None:
        return None
    return bool(proc._save_process.is_alive())


def stop_checkpoint_process() -> None:
    """At exit (before ``multiprocessing``'s exit handler, which would SIGTERM and join it): ask
    DCP's checkpoint process to stop, and kill it when it does not within 10 s."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = ape._CHECKPOINT_PROCESS
    if proc is None:
        return
    child = proc._save_process
    with contextlib.suppress(Exception):
        if child.is_alive():
            proc._send(ape._CheckpointSaveProcessControlOpts.TERMINATE)
            child.join(10)
    with contextlib.suppress(Exception):
        if child.is_alive():
            child.kill()
            child.join(5)
    ape._CHECKPOINT_PROCESS = None
