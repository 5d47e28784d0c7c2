"""Where a ``dcp`` background save is written: the modes (:data:`ASYNC_MODES`), the one
``checkpoint.async_writer=auto`` picks for a device (:func:`resolve_async_mode`), and DCP's
checkpoint process of a training process: started once without running the training script
again in it, shielded from a preemption SIGTERM, stopped at exit.

DCP starts that process with ``spawn``: a fresh interpreter that imports torch again (about 6 s of
CPU here, taken from training on a small machine, and the first save waits for it). On a CPU run
``aios.init`` forks a *standby* instead, before the process group exists and while the training
process runs no thread (:func:`fork_standby`; forking then is as safe as a DataLoader's fork
before its first batch): it shields itself at once and sleeps until the first background save
hands it the process group's address, then runs DCP's own serving loop, as the spawned process
would. Any other case (threads already running, CUDA, not Linux) spawns as before."""

from __future__ import annotations

import contextlib
import importlib.machinery
import multiprocessing
import multiprocessing.connection
import multiprocessing.process
import multiprocessing.util
import os
import sys
import threading
import time
from typing import Any

from aios.checkpoint.writer import ShieldedTarget, shield

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


#: devices whose checkpoint process may be forked as a standby (:func:`fork_standby`): cpu. A
#: CUDA process must not fork once CUDA is initialised, and a script may do that before init
STANDBY_DEVICES = ("cpu",)


class _Standby:
    """A forked checkpoint process waiting for its process group (:func:`fork_standby`)."""

    def __init__(
        self,
        process: multiprocessing.process.BaseProcess,
        conn: multiprocessing.connection.Connection,
    ) -> None:
        self.process = process
        self.conn = conn


_STANDBY: _Standby | None = None


def standby_wanted(
    *, directory: str | None, async_save: bool, async_writer: str, fmt: str, device_type: str | None
) -> bool:
    """Whether this run's background saves will be written by DCP's checkpoint process on a
    device whose process may be forked (:data:`STANDBY_DEVICES`)."""
    return (
        bool(directory)
        and async_save
        and fmt == "dcp"
        and device_type in STANDBY_DEVICES
        and resolve_async_mode(async_writer, device_type) == "process"
    )


def _threads_of_this_process() -> int:
    """Threads of this process, native ones included (0: unknown)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _one_thread(settle: float = 0.5) -> bool:
    """Whether this process runs one thread. A Python thread that was joined (the plugin
    loader's guarded calls) may still be leaving the kernel's list for a moment: with no other
    Python thread, wait up to ``settle`` seconds for the native ones to end."""
    if threading.active_count() != 1:
        return False
    end = time.monotonic() + settle
    while (n := _threads_of_this_process()) > 1 and time.monotonic() < end:
        time.sleep(0.005)
    return n == 1


def fork_standby() -> bool:
    """Before the process group exists (``aios.init``): fork this process's checkpoint process
    now, as a standby, when it is safe, i.e. Linux and this process runs one thread (no lock
    held by another thread can be copied into the child). Returns whether one was forked."""
    global _STANDBY
    if _STANDBY is not None:
        return True
    if not sys.platform.startswith("linux") or not _one_thread():
        return False
    ctx = multiprocessing.get_context("fork")
    conn, child_end = ctx.Pipe()
    proc = ctx.Process(
        target=_standby_main, args=(child_end, os.getpid()), name="aios-checkpoint", daemon=True
    )
    proc.start()
    child_end.close()
    _STANDBY = _Standby(proc, conn)
    multiprocessing.util.Finalize(None, stop_checkpoint_process, exitpriority=100)
    return True


def _standby_main(conn: multiprocessing.connection.Connection, parent_pid: int) -> None:
    """The standby: shielded as the spawned process is (:func:`aios.checkpoint.writer.shield`),
    then asleep until the first background save sends the process group's address (or the
    training process ends it: ``None``, or the pipe closes)."""
    shield(parent_pid)
    try:
        info = conn.recv()
    except (EOFError, OSError):
        return
    if info is None:
        return
    ShieldedTarget(parent_pid)(info, conn)


def _from_standby(ape: Any, info: Any) -> Any:
    """DCP's checkpoint-process handle for the standby, which joins the process group of
    ``info``: what ``_AsyncCheckpointProcess.__init__`` would set up, with the forked process in
    place of a spawned one (the handle's other methods are DCP's own)."""
    standby = _STANDBY
    assert standby is not None
    handle = ape._AsyncCheckpointProcess.__new__(ape._AsyncCheckpointProcess)
    handle.ctx = multiprocessing.get_context("fork")
    handle._process_pipe = standby.conn
    handle._save_process = standby.process
    handle._send(info)
    response = handle._wait_for_response(timeout=1800)
    if response != ape._CheckpointSaveProcessControlOpts.INIT_COMPLETE:
        raise RuntimeError(f"DCP's checkpoint process did not start: {response!r}")
    return handle


def start_checkpoint_process(group: Any) -> None:
    """Collective, at the first process-mode save: start DCP's checkpoint process of this rank
    (once per training process) now, on this thread, so that the training script is not run
    again in it, at a lower CPU/IO priority. Blocks until every rank's process has joined its
    gloo group (once; seconds)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    if ape._CHECKPOINT_PROCESS is not None:
        return
    info = ape._ProcessGroupInitInfo(group)
    global _STANDBY
    if _STANDBY is not None and _STANDBY.process.is_alive():
        ape._CHECKPOINT_PROCESS = _from_standby(ape, info)
        _STANDBY = None  # it is the checkpoint process now (stopped at exit as such)
        return
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
    global _STANDBY
    standby, _STANDBY = _STANDBY, None
    ape = sys.modules.get("torch.distributed.checkpoint._async_process_executor")
    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is None:
        if standby is not None:  # never used: it sleeps in recv()
            _end(standby.process, lambda: standby.conn.send(None))
        return
    child = proc._save_process
    _end(child, lambda: proc._send(ape._CheckpointSaveProcessControlOpts.TERMINATE))  # type: ignore[union-attr]
    ape._CHECKPOINT_PROCESS = None  # type: ignore[union-attr]


def _end(child: Any, ask: Any) -> None:
    """Ask the checkpoint process ``child`` to stop; kill it when it has not within 10 s."""
    with contextlib.suppress(Exception):
        if child.is_alive():
            ask()
            child.join(10)
    with contextlib.suppress(Exception):
        if child.is_alive():
            child.kill()
            child.join(5)
