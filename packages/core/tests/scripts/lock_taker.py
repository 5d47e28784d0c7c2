"""A long-lived lock contender for test_lock_atomic.py: each round it waits at the barrier with
the others, tries to take the lock of ``ckdir`` once and reports whether it won."""

from __future__ import annotations

from typing import Any


def refuse_directory_flocks() -> None:
    """What an NFS mount does: the Linux NFS client emulates flock(2) with fcntl byte-range
    locks, and an exclusive one needs a file open for writing, so LOCK_EX on a directory fails
    with EBADF (flock(2), NOTES: https://man7.org/linux/man-pages/man2/flock.2.html)."""
    import errno
    import fcntl
    import os
    import stat

    real = fcntl.flock

    def flock(fd: Any, op: int) -> None:
        if stat.S_ISDIR(os.fstat(fd if isinstance(fd, int) else fd.fileno()).st_mode):
            raise OSError(errno.EBADF, os.strerror(errno.EBADF))
        real(fd, op)

    fcntl.flock = flock  # type: ignore[assignment]


def take(ckdir: str, rounds: int, barrier: Any, results: Any, me: int, nfs: bool = False) -> None:
    from aios.checkpoint import CheckpointStore
    from aios.errors import CheckpointError

    if nfs:
        refuse_directory_flocks()

    for _ in range(rounds):
        barrier.wait()
        store = CheckpointStore(ckdir, keep=None)
        try:
            store.acquire_lock({"run_id": f"taker-{me}"})
            won = True
        except CheckpointError:
            won = False
        results.put((me, won))
